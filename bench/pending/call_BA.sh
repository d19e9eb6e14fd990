# Call BA (forty-first session): s41e, bench.sparse of the union kernel over four row formats
# (the product's spec and bench/pending/s41e/*.yaml), alternating, 2 rounds. Carry .whl_kgen. ~5 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for round in 1 2; do
  for s in specs/glm5_dsa_sm120.yaml bench/pending/s41e/dsa_e4m3.yaml bench/pending/s41e/dsa_fp8pt.yaml bench/pending/s41e/dsa_bf16.yaml; do
    step "r${round}_$(basename $s .yaml)" 150 python3 -m bench.sparse --spec $s --shapes 0,1,7,2,9 --out /tmp/s41e
  done
done
cd "$OUT" && cat r1_*.log r2_*.log > s41e.log && rm -f r1_*.log r2_*.log
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
