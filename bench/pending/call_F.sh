# Call F: v73 (fp8 pairs unpacked in place on sm_90) on the sparse union: main (a9faf41+) / d8be9e3.
set -u
mkdir -p "$OUT"; t0=$SECONDS
AB_CHANGE= AB_MODULE=bench.sparse AB_TREES="main d8be" timeout 420 bash bench/gpu_ab.sh sparse 2 \
  --spec specs/glm5_dsa_sm120.yaml --time-limit 40
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
