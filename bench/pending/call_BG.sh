# Call BG (for the next session): is SGLang's DSA graph test flaky on main, and does v97 (the sparse
# step's kernel by size, bench/pending/v97-union-by-size.patch) pass? Two runs of the graph test on
# main (-rA prints each seed), then v97 applied: the graph test twice, the whole SGLang DSA
# file and the sparse GPU suite. Carry .whl and .whl_kgen. ~8 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
sglang() { local name=$1 select=$2
  OUT=$OUT bash bench/gpu_sglang.sh -rA -k "$select" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
for i in 1 2; do sglang "main_graph$i" "sglang_dsa_gpu and graph"; done
patch -p1 -s < bench/pending/v97-union-by-size.patch
for i in 1 2; do sglang "v97_graph$i" "sglang_dsa_gpu and graph"; done
sglang v97_all sglang_dsa_gpu
source bench/pending/steps.sh
step v97_sparse 240 python3 -m pytest -q -m gpu tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
