# Call EB (fifty-fifth session): bench.gather_probe at the batched shapes (bench/NOTES.md s55c): the
# rows each design moves at B32 L32768 T16 and B8 L131072 T16, kgen's producer, one and two CTAs an SM.
# Carry .whl_kgen. ~2 min (EB_B8=0: the B32 probe alone, ~1 min).
set -u
source bench/pending/steps.sh
step probe_b32 120 python3 -m bench.gather_probe --shape 32,32768,16 --modes 0 --out "$OUT"
[ "${EB_B8:-1}" = 1 ] && step probe_b8 110 python3 -m bench.gather_probe --shape 8,131072,16 --modes 0 --out "$OUT"
cat "$OUT"/probe_b*.log; cat "$OUT/summary.log"
