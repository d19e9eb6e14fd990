# Call BK (for the next session, after BJ, v98 still applied): v98's sparse GPU suite, then SGLang's
# DSA file (the launch attribute under graph capture, after non-kernel nodes too) at call BF's session
# seed, which also checks the graph test's tie-aware top-k comparison where call BG met an exact
# tie. Carry .whl and .whl_kgen. ~5 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
step v98_sparse 240 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
KGEN_TEST_SEED=2386663628502398681 OUT=$OUT bash bench/gpu_sglang.sh -rA -k sglang_dsa_gpu > "$OUT/v98_sglang.log" 2>&1
echo "v98_sglang: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/v98_sglang.log")" >> "$OUT/summary.log"
