# Call AD (thirty-eighth session): where the batched union's tile loop goes (issue 21's >= 50% of the
# union floor at B >= 8): ncu's per-SASS stall samples of the union kernel at B32 L32768 T16 and B8
# L131072 T16 (second call, caches as a server leaves them), with its bench row beside. Carry .whl_kgen.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for shape in 32,16,32768 8,16,131072; do
  name=b${shape%%,*}
  step "ncu_$name" 150 ncu --clock-control none --cache-control none --set full --import-source no \
      -k regex:sparse_verify --launch-skip 1 -c 1 -f -o "/tmp/ncu_$name" \
      python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape "$shape" --calls 3
  ncu -i "/tmp/ncu_$name.ncu-rep" --page details --csv > "$OUT/ncu_${name}_details.csv" 2>&1
  ncu -i "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${name}_sass.csv" 2>&1
  gzip -f "$OUT/ncu_${name}_sass.csv"
done
step trace_b32 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
