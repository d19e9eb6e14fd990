# Call BD (forty-first session): the sparse kernels on 16-row tiles two CTAs an SM (the sm_90 plan's
# new sparse tiles) through SGLang's DSA backend (tests/test_sglang_dsa_gpu.py), the sparse GPU suite,
# and issue 21's table with FlashMLA's sparse decode, --check against the float64 reference. Carry .whl
# (SGLang, pydantic) with sgl_flash_mla's wheel copied into it, and .whl_kgen. ~7 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
OUT=$OUT bash bench/gpu_sglang.sh -k sglang_dsa_gpu > "$OUT/sglang_dsa.log" 2>&1
echo "sglang_dsa: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/sglang_dsa.log")" >> "$OUT/summary.log"
source bench/pending/steps.sh
step tests_sparse 240 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
step sparse_bench 200 python3 -m bench.sparse --check --out "$OUT"
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
