# Call BL (forty-third session): the final commit's tables on whatever card comes: issue 21's sparse
# table with FlashMLA's sparse decode and the new `rows x` column (sm_90 plan, all shapes), the sm_120
# plan's sparse kernels (32-row tiles) on the batched shapes, and issue 20's DSA rows. Carry .whl_peers.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$OUT/summary.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_peers/*.whl
step() { local name=$1 limit=$2 s=$SECONDS; shift 2
  env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/kc timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
step sparse_sm90 200 python3 -m bench.sparse --out "$OUT"
step sparse_sm120 150 python3 -m bench.sparse --plan-arch sm_120 --shapes 0,1,2,7,9 --out "$OUT"
step dsa_rows 120 python3 -m bench.dsa_rows --out "$OUT"
