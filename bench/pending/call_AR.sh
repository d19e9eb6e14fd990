# Call AR (fortieth session): the union's slot-range report once per CTA (split 0, after the rounds)
# instead of every round: the sparse GPU suite on both plans (its KGEN_VALIDATE cases), and a timing
# check against v94b (.ab/v94b.tgz), one round. Carry .whl_kgen and .ab. ~4 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
step tests_sm90 200 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
step tests_sm120 200 env KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
AB_MODULE=bench.sparse AB_TREES=v94b bash bench/gpu_ab.sh report 1 --shapes 0,2
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
