# Call CJ (fifty-second session): ncu SourceCounters of the sm_120 plan's sparse union (the product on
# sm_120: 32-row tiles of 4 tokens, 32-bit key masks picked at once, EARLY_MASKS) built for sm_90, at
# B8 L131072 T16 and B32 L32768 T16 (0.7 shared): does the masks' wait v106 removed from the sm_90
# plan hold its tiles too? Read with python -m bench.sass_samples. Carry .whl_kgen and .kcache. ~1 min.
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
prof() {  # name, profile_one arguments
    local name=$1; shift
    step "ncu_$name" 80 ncu --clock-control none -k regex:sparse_verify --launch-skip 2 -c 1 --section SourceCounters \
        --section WarpStateStats --section SpeedOfLight --import-source no -o "/tmp/src_$name" \
        python3 -m bench.profile_one --calls 3 --spec specs/glm5_dsa_sm120.yaml --plan-arch sm_120 "$@"
    ncu --import "/tmp/src_$name.ncu-rep" --page source --print-source sass --csv 2>/dev/null | gzip > "$OUT/sass_$name.csv.gz"
}
prof sm120_union_b8 --shape 8,16,131072
prof sm120_union_b32 --shape 32,16,32768
rm -f "$OUT"/ncu_*.log
cat "$OUT/summary.log"
