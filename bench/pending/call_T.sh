# Call T (after call S, same working tree = v84 + v85 + v86): the whole sparse suite on both plans (the
# sm_120 plan's catches round races), then one traced call of v86 at B1 T16 and B32 L32768 (schedule phase).
set -u
t0=$SECONDS
source bench/pending/steps.sh
step sparse90 170 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_gpu.py
step sparse120 170 env KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_gpu.py
step trace_b1 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
step trace_b32 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
