# Call BG: is SGLang's DSA graph test's failure under v97 (call BF) the test's own? First main's graph
# test at call BF's session seed (its selection depends only on the seed: the test's logits are made
# on the CPU), where one row's 2048th and 2049th logits lie one float32 ulp apart; then v97 applied
# (bench/pending/v97-union-by-size.patch) at that seed, its sparse suite's launch and graph tests,
# and the whole SGLang DSA file. Carry .whl and .whl_kgen. ~5 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
sglang() { local name=$1 select=$2
  OUT=$OUT bash bench/gpu_sglang.sh -rA -k "$select" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
export KGEN_TEST_SEED=2386663628502398681
sglang main_graph_bf_seed "sglang_dsa_gpu and graph and fp8"
patch -p1 -s < bench/pending/v97-union-by-size.patch
sglang v97_graph_bf_seed "sglang_dsa_gpu and graph and fp8"
unset KGEN_TEST_SEED
source bench/pending/steps.sh
step v97_sparse 200 python3 -m pytest -q -m gpu tests/test_sparse_gpu.py -k "launch or graph or replay"
sglang v97_all sglang_dsa_gpu
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
