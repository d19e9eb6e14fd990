# Call AJ (thirty-ninth session): the final kernels (v91, v91b, v92) under the checks that also cover
# them: kgen's SGLang DSA backend (the sparse step) against SGLang's DSA backend and the reference, the
# sparse GPU suite with the sm_120 plan, and bench.sparse's table on the sm_90 plan. Carry .whl (SGLang
# and pydantic); ~8 min with the compiles.
set -u
t0=$SECONDS
mkdir -p "$OUT"
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >> "$OUT/summary.log"
KGEN_CACHE_DIR=/tmp/kc timeout 250 bash bench/gpu_sglang.sh -k sglang_dsa_gpu > "$OUT/sglang_dsa.log" 2>&1
echo "sglang_dsa: rc=$? $(tail -n 1 "$OUT/sglang_dsa.log")" >> "$OUT/summary.log"
export PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/kc
KGEN_TEST_PLAN_ARCH=sm_120 timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_gpu.py \
    > "$OUT/sparse_tests_sm120.log" 2>&1
echo "sparse_tests_sm120: rc=$? $(tail -n 1 "$OUT/sparse_tests_sm120.log")" >> "$OUT/summary.log"
timeout 100 python3 -m bench.sparse --out "$OUT" > "$OUT/sparse_bench.log" 2>&1
echo "sparse_bench: rc=$? $(tail -n 1 "$OUT/sparse_bench.log")" >> "$OUT/summary.log"
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
