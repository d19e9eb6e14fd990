# Call BC (forty-first session): the sparse kernels on the plan's tiles and on 16-row tiles two CTAs an
# SM at 2 / 3 / 4 stages, all ten bench.sparse shapes, alternating, 2 rounds. Carry .whl_kgen. ~6 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for round in 1 2; do
  step "r${round}_plan" 200 python3 -m bench.sparse --out /tmp/s41g
  for t in 16,32,1,2,2 16,32,1,3,2 16,32,1,4,2; do
    step "r${round}_$t" 200 python3 -m bench.sparse --tiles mma_sync:$t --out /tmp/s41g
  done
done
cd "$OUT" && for f in r1_* r2_*; do echo "== $f"; cat "$f"; done > s41g.log && rm -f r1_* r2_*
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
