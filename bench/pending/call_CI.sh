# Call CI (fifty-second session): ncu SourceCounters (stall samples by SASS line) of the sm_120 plan's
# dense verify (glm5_sm120, page 1, built for sm_90) at B1 L131072 T16 H8, for issue 19's sm_120 loop;
# read with python -m bench.sass_samples. Carry .whl_kgen and .kcache. ~1 min.
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
step ncu_sm120_b1 100 ncu --clock-control none -k regex:verify_attn --launch-skip 2 -c 1 --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight --import-source no -o /tmp/src_sm120_b1 \
    python3 -m bench.profile_one --calls 3 --spec specs/glm5_sm120.yaml --plan-arch sm_120 --shape 1,16,131072
ncu --import /tmp/src_sm120_b1.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > "$OUT/sass_sm120_b1.csv.gz"
ncu --import /tmp/src_sm120_b1.ncu-rep --page details 2>/dev/null | head -n 120 > "$OUT/details_sm120_b1.txt"
cat "$OUT/summary.log"
