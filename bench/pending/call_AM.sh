# Call AM (fortieth session): on an H200, the model's short calls (call AC's step: issue 19 item 4),
# then issue 21's sparse table with FlashMLA's sparse decode and issue 20's DSA-row timings on main's
# kernels; on another card the sparse table only (FlashMLA beside kgen on that card). Carry
# .whl_peers (FlashMLA, FlashInfer, pydantic). ~8 min on an H200 with the start.
set -u
t0=$SECONDS
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_peers/*.whl
step() { local name=$1 limit=$2 s=$SECONDS; shift 2
  env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/kc timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" >> "$OUT/summary.log"
case $gpu in *H200*) h200=1 ;; *) h200=0 ;; esac
[ $h200 = 1 ] && step model_short 240 python3 -m bench.model_validate \
    --variants sm120_plan,sm90_plan,overlap,seesaw3,mma16 \
    --shapes small_decode,short_decode_8k,short_decode_16k,short_decode_b4,small,small_8k,memory,compute \
    --out "$OUT/model_validate_short.json"
step sparse_bench 150 python3 -m bench.sparse --out "$OUT"
[ $h200 = 1 ] && step dsa_rows 100 python3 -m bench.dsa_rows --out "$OUT"
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
