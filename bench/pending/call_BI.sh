# Call BI (forty-second session): on main with v97 landed, SGLang's DSA graph test at call BF's seed
# (row 58 holds an exact float32 tie at the top-k boundary, call BG), with the test now comparing
# top-k's up to such ties; then the whole SGLang DSA file at a fresh seed. Carry .whl and .whl_kgen.
set -u
t0=$SECONDS
mkdir -p "$OUT"
sglang() { local name=$1 select=$2
  OUT=$OUT bash bench/gpu_sglang.sh -rA -k "$select" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
KGEN_TEST_SEED=2386663628502398681 sglang graph_bf_seed "sglang_dsa_gpu and graph"
sglang dsa_all sglang_dsa_gpu
