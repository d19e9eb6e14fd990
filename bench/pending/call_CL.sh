# Call CL (fifty-third session, right after CK on the same machine): ncu SourceCounters of v110's warp
# softmax on the sm_120 plan's dense verify (B1 L131072 T16, clusters of 2: call CI's shape and tiling,
# so the two read side by side with python -m bench.sass_samples), then call CJ (the sm_120 plan's
# sparse union by SASS line). Carry .whl_kgen and .kcache. ~3 min.
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
step ncu_warp_b1 100 ncu --clock-control none -k regex:verify_attn --launch-skip 2 -c 1 --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight --import-source no -o /tmp/src_warp_b1 \
    python3 -m bench.profile_one --calls 3 --spec specs/glm5_sm120.yaml --plan-arch sm_120 --shape 1,16,131072 \
    --tiles mma_sync:32,32,2,2,1,2,1,0,1
ncu --import /tmp/src_warp_b1.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > "$OUT/sass_warp_b1.csv.gz"
ncu --import /tmp/src_warp_b1.ncu-rep --page details 2>/dev/null | head -n 120 > "$OUT/details_warp_b1.txt"
source bench/pending/call_CJ.sh
