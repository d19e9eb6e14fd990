# Call AD (thirty-eighth session): is the batched union's tile loop bound by its ring's depth (issue 21's
# >= 50% of the union floor at B >= 8)? bench.sparse with the sparse kernels forced to mma.sync rings of
# 4 (the plan's depth), 6 and 8 stages (sm_90's shared memory holds 8: 228,864 B, 0 spills), B1 / B8 /
# B32 / B64; then ncu's per-SASS stall samples of the union kernel at B32 L32768 T16. Carry .whl_kgen.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for s in 4 8 6; do
  step "stages$s" 150 python3 -m bench.sparse --tiles "mma_sync:32,32,2,$s,1" --shapes 2,9,1,0 --out "$OUT"
done
name=b32
step "ncu_$name" 150 ncu --clock-control none --cache-control none --set full --import-source no \
    -k regex:sparse_verify --launch-skip 1 -c 1 -f -o "/tmp/ncu_$name" \
    python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768 --calls 3
ncu -i "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${name}_sass.csv" 2>&1
gzip -f "$OUT/ncu_${name}_sass.csv"
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
