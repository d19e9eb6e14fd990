# Call AW (forty-first session): on an H200, call AN (the model's short calls, issue 21's table with
# FlashMLA, issue 20's rows); on any other card, call AV (v95b / v95-diag against main, then v95b's
# sparse suite). Carry .whl_peers and .ab (56 MB; .whl_kgen's pydantic wheels come from .whl_peers).
set -u
mkdir -p "$OUT"
[ -d .whl_kgen ] || { mkdir .whl_kgen && cp .whl_peers/{pydantic,annotated,typing}*.whl .whl_kgen/; }
case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
  *H200*) bash bench/pending/call_AN.sh ;;
  *) echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >> "$OUT/summary.log"
     bash bench/pending/call_AV.sh ;;
esac
