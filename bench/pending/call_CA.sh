# Call CA: where in its SASS the batched union loop's warps wait (calls BW / BY: latency-bound, no unit
# near its peak, `wait` the leading stall). ncu's SourceCounters (PC sampling: stall reasons a SASS
# instruction) of main's union and gather kernels at B32 L32768 T16 (0.7 shared), sm_90 plan, the
# third call's launch; each report is printed as CSV of SASS lines with their samples (--page source).
# Carry .whl_kgen and .kcache (bench/pending/prep_CA.sh builds both here).
# ~3 min. Read: sort the CSV by its stall columns; which instructions the `wait` samples sit on (an
# F2FP feeding an HMMA, an HMMA's accumulator, the softmax's FMUL/EX2 chain, the scan's hash).
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
for run in union: gather:--gather; do
    IFS=: read -r name flag <<< "$run"
    step "ncu_src_$name" 150 ncu --clock-control none -k regex:sparse_[vg] --launch-skip 2 -c 1 \
        --section SourceCounters --section WarpStateStats --import-source no -o "/tmp/src_$name" \
        python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768 --calls 3 $flag
    ncu --import "/tmp/src_$name.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_$name.csv" 2> "$OUT/sass_$name.err"
    gzip -f "$OUT/sass_$name.csv"
done
cat "$OUT/summary.log"
