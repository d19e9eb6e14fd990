# Call AK (fortieth session): v93, the mma.sync loop without its producer warp. bench.sparse A/B of
# the sparse kernels' tiling with (pw1) and without (pw0) the producer warp, alternating, 2 rounds;
# then the sparse GPU suite with every plan on the mma.sync loop without the producer warp.
# Carry .whl_kgen; ~7 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
for r in 1 2; do
  for t in pw1:mma_sync:32,32,2,4,1 pw0:mma_sync:32,32,2,4,1,1,1,0,0; do
    step "ab_${t%%:*}_$r" 100 python3 -m bench.sparse --tiles "${t#*:}" --shapes 2,9,1,0,5,4,3 --out /tmp/res
  done
done
step tests_pw0 300 env KGEN_TEST_PRODUCER_WARP=0 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
