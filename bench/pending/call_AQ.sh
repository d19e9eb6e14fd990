# Call AQ (fortieth session): the final kernels through SGLang's DSA backend (tests/test_sglang_dsa_gpu.py),
# issue 21's sparse table with FlashMLA's sparse decode, issue 20's DSA-row timings. Carry .whl (SGLang,
# pydantic) with sgl_flash_mla's wheel copied into it (.whl_peers is too big to carry beside it). ~6 min.
set -u
t0=$SECONDS
mkdir -p "$OUT"
OUT=$OUT bash bench/gpu_sglang.sh -k sglang_dsa_gpu > "$OUT/sglang_dsa.log" 2>&1
echo "sglang_dsa: rc=$? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/sglang_dsa.log")" >> "$OUT/summary.log"
step() { local name=$1 limit=$2 s=$SECONDS; shift 2
  env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/kgen_cache timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
step sparse_bench 150 python3 -m bench.sparse --out "$OUT"
step dsa_rows 120 python3 -m bench.dsa_rows --out "$OUT"
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
