# Call H (s29e): the model's measurements on today's code: the s15 variants, the 16-row decode
# variant and decode B32 L131072, timed on the H200 (bench.model_validate).
set -u
mkdir -p "$OUT"; t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_kgen/*.whl
PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/kc timeout 400 python3 -m bench.model_validate \
  --out "$OUT/model_validate-s32.json" --variants sm120_plan,sm90_plan,overlap,seesaw3,mma16 \
  --shapes compute,compute_b8,compute_l32k,compute_t64,memory,memory_b32,memory_b32_long,small,small_b32,small_decode \
  > "$OUT/validate.log" 2>&1
echo "validate rc=$? $((SECONDS - t0)) s" >> "$OUT/summary.log"
