# Call AN (fortieth session): call AC's step with .whl_peers as the wheels (no .whl_kgen needed): the
# model's short calls on an H200 (issue 19 item 4), then issue 20's DSA-row timings; on another card
# it says so and stops. Carry .whl_peers. ~5 min on an H200 with the start.
set -u
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" >> "$OUT/summary.log"
case $gpu in *H200*) ;; *) echo "not an H200: stop" >> "$OUT/summary.log"; exit 0 ;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_peers/*.whl
step() { local name=$1 limit=$2 s=$SECONDS; shift 2
  env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/kc timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
step model_short 300 python3 -m bench.model_validate --variants sm120_plan,sm90_plan,overlap,seesaw3,mma16 \
    --shapes small_decode,short_decode_8k,short_decode_16k,short_decode_b4,small,small_8k,memory,compute \
    --out "$OUT/model_validate_short.json"
step sparse_bench 150 python3 -m bench.sparse --out "$OUT"
step dsa_rows 100 python3 -m bench.dsa_rows --out "$OUT"
