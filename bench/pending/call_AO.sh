# Call AO (fortieth session): v94 (the union scan's queue by one warp-wide sum) against main
# (.ab/base.tgz), bench.sparse alternating, 2 rounds; then the sparse GPU suite on v94 with both plans.
# Carry .whl_kgen and .ab. ~6 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES="${TREES:-base}" bash bench/gpu_ab.sh "${NAME:-v94}" 2 --shapes 0,5,6,1,2,9,3,4,8
step tests_sm90 200 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
step tests_sm120 200 env KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
