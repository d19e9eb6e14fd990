# Call BH (forty-second session): on an H200, issue 21's table with FlashMLA (bench.sparse), issue 20's
# DSA rows and the model's short calls (call AN's steps, FlashMLA's wheel copied into .whl_kgen); on any
# other card, call BG (SGLang's DSA graph test on main and with v97). Carry .whl and .whl_kgen.
set -u
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" >> "$OUT/summary.log"
case $gpu in
  *H200*) source bench/pending/steps.sh
     step sparse_bench 200 python3 -m bench.sparse --out "$OUT"
     step dsa_rows 100 python3 -m bench.dsa_rows --out "$OUT"
     step model_short 280 python3 -m bench.model_validate --variants sm120_plan,sm90_plan,overlap,seesaw3,mma16 \
         --shapes small_decode,short_decode_8k,short_decode_16k,short_decode_b4,small,small_8k,memory,compute \
         --out "$OUT/model_validate_short.json" ;;
  *) bash bench/pending/call_BG.sh ;;
esac
