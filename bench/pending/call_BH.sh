# Call BH (forty-second session): call BG (SGLang's DSA graph test on main and with v97) on any card;
# then, on an H200 only, issue 21's table with FlashMLA (bench.sparse; FlashMLA's wheel copied into
# .whl_kgen), on v97's tree (BG applied it). Carry .whl and .whl_kgen.
set -u
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" >> "$OUT/summary.log"
bash bench/pending/call_BG.sh
case $gpu in
  *H200*) source bench/pending/steps.sh
     step sparse_bench 170 python3 -m bench.sparse --out "$OUT" ;;
esac
