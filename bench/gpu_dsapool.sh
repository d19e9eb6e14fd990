#!/usr/bin/env bash
# On the H200, from the repository root: the DSA pool rows' GPU tests (issue 20) with the GPU's own
# plan, then with the sm_120 plan (KGEN_TEST_PLAN_ARCH=sm_120), half the random cases each, then the
# page-64 DSA row timings (bench/dsa_rows.py, sm_90 plan; DSAPOOL_BENCH=0 skips them). Logs under $OUT.
# Extra arguments go to both pytest runs. SGLang's CUDA writer check needs sglang importable
# (bench/gpu_sglang.sh tests/test_dsa_pool_gpu.py runs it with the carried wheels); it skips otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 KGEN_CACHE_DIR="${KGEN_CACHE_DIR:-/tmp/kgen_cache}"
TESTS=(tests/test_dsa_pool_gpu.py tests/test_attention_gpu.py tests/test_step_gpu.py)
PICK="dsa or glm5_p64"
KGEN_TEST_RANDOM_SCALE=0.5 timeout 130 python3 -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}" -k "$PICK" "$@" 2>&1 | tee "$OUT/dsapool_own_plan.log"
KGEN_TEST_PLAN_ARCH=sm_120 KGEN_TEST_RANDOM_SCALE=0.5 timeout 100 python3 -m pytest -q -p no:cacheprovider -rs \
    "${TESTS[@]}" -k "$PICK" "$@" 2>&1 | tee "$OUT/dsapool_sm120_plan.log"
[ "${DSAPOOL_BENCH:-1}" = 0 ] || timeout 75 python3 -m bench.dsa_rows --out "$OUT" 2>&1 | tee "$OUT/dsapool_bench.log"
