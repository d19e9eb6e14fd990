# Call AC (thirty-eighth session): the model's short calls on an H200 (issue 19 item 4: the model is
# fitted on H200 runs only). On another card it says so and stops. Carry .whl_kgen; ~2 min with the start.
set -u
source bench/pending/steps.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" >> "$OUT/summary.log"
case $gpu in *H200*) ;; *) echo "not an H200: stop" >> "$OUT/summary.log"; exit 0 ;; esac
step model_short 300 python3 -m bench.model_validate --variants sm120_plan,sm90_plan,overlap,seesaw3,mma16 \
    --shapes small_decode,short_decode_8k,short_decode_16k,short_decode_b4,small,small_8k,memory,compute \
    --out "$OUT/model_validate_short.json"
