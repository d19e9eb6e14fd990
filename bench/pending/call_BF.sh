# Call BF (forty-first session): the default sparse step's choice (union=None: gather where 2-token
# row tiles get many splits) through SGLang's DSA backend and the one-shot op in the sparse GPU suite.
# Carry .whl and .whl_kgen. ~4 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
OUT=$OUT bash bench/gpu_sglang.sh -k sglang_dsa_gpu > "$OUT/sglang_dsa.log" 2>&1
echo "sglang_dsa: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/sglang_dsa.log")" >> "$OUT/summary.log"
source bench/pending/steps.sh
step tests_sparse 200 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
