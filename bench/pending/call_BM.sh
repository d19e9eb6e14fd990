# Call BM (forty-third session): the final commit's GPU suites for the sparse path and the DSA pool,
# both plans (the sm_90 plan on its own card, then KGEN_TEST_PLAN_ARCH=sm_120), and SGLang's DSA and
# GLM-5 files. Carry .whl and .whl_kgen. ~8 min.
set -u
source bench/pending/steps.sh
step sparse_sm90 150 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py tests/test_dsa_pool_gpu.py
KGEN_TEST_PLAN_ARCH=sm_120 step sparse_sm120 150 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py tests/test_dsa_pool_gpu.py
OUT=$OUT timeout 130 bash bench/gpu_sglang.sh -rA -k "sglang_dsa_gpu or glm5_gpu" > "$OUT/sglang.log" 2>&1
echo "sglang: rc=$? $(tail -n 1 "$OUT/sglang.log")" >> "$OUT/summary.log"
