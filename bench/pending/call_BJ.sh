# Call BJ (for the next session): v98 (bench/pending/v98-sparse-attention-pdl.patch: the sparse
# attention kernels launched to overlap the kernel before them) against main, bench.sparse on seven
# shapes, 2 rounds alternating; then v98's sparse GPU suite and SGLang's DSA file (the launch
# attribute under graph capture after non-kernel nodes). Set-up here first:
#   git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   git apply bench/pending/v98-sparse-attention-pdl.patch
# Carry .whl, .whl_kgen and .ab (~48 MB). ~8 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
AB_MODULE=bench.sparse AB_TREES=main bash bench/gpu_ab.sh v98 2 --shapes 0,1,2,3,5,8,10
echo "ab: $((SECONDS - t0)) s" >> "$OUT/summary.log"
source bench/pending/steps.sh
step v98_sparse 200 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
OUT=$OUT bash bench/gpu_sglang.sh -k sglang_dsa_gpu > "$OUT/v98_sglang.log" 2>&1
echo "v98_sglang: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/v98_sglang.log")" >> "$OUT/summary.log"
