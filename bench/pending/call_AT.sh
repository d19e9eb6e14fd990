# Call AT (fortieth session, the last device minutes): call AN trimmed to the model's short decode calls
# (the overlap loop's decode, the sm_120 plan's, 16-row tiles) on an H200; on another card it stops.
# Carry .whl_kgen. ~3 min on an H200 with the start.
set -u
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" >> "$OUT/summary.log"
case $gpu in *H200*) ;; *) echo "not an H200: stop" >> "$OUT/summary.log"; exit 0 ;; esac
source bench/pending/steps.sh
step model_short 170 python3 -m bench.model_validate --variants overlap,sm120_plan,mma16 \
    --shapes small_decode,short_decode_8k,short_decode_16k,short_decode_b4 --out "$OUT/model_validate_short.json"
