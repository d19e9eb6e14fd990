# Call BE (forty-first session): union against gather on the landed sparse tiles at B = 1, 2, 4
# (L131072 T16 0.7) and B1 no overlap / 0.9 shared: where the union starts to pay. Two rounds. Carry
# .whl_kgen. ~2.5 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for round in 1 2; do step "r$round" 120 python3 -m bench.sparse --shapes 0,10,11,5,6 --out /tmp/s41h; done
cd "$OUT" && cat r1.log r2.log > s41h.log && rm -f r1.log r2.log
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
