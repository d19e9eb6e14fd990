# Call BI (forty-second session): SGLang's DSA graph test at call BF's seed, whose row 58 holds an exact
# float32 tie at the top-k boundary (call BG), with the test comparing top-k's up to such ties; on
# main, then with v97. Carry .whl and .whl_kgen. ~2 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
sglang() { local name=$1 select=$2
  OUT=$OUT bash bench/gpu_sglang.sh -rA -k "$select" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
export KGEN_TEST_SEED=2386663628502398681
sglang main_graph_bf_seed "sglang_dsa_gpu and graph"
patch -p1 -s < bench/pending/v97-union-by-size.patch
sglang v97_graph_bf_seed "sglang_dsa_gpu and graph"
