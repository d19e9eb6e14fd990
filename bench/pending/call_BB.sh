# Call BB (forty-first session): s41f, bench.sparse of the product spec on the plan's tiling and two
# 16-row tilings, alternating, 2 rounds. Carry .whl_kgen. ~5 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for round in 1 2; do
  step "r${round}_plan" 150 python3 -m bench.sparse --shapes 0,1,7,2,9 --out /tmp/s41f
  for t in 16,32,1,4,1 16,32,1,2,2; do
    step "r${round}_$t" 150 python3 -m bench.sparse --tiles mma_sync:$t --shapes 0,1,7,2,9 --out /tmp/s41f
  done
done
cd "$OUT" && for f in r1_* r2_*; do echo "== $f"; cat "$f"; done > s41f.log && rm -f r1_* r2_*
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
