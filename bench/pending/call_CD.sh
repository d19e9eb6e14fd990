# Call CD: main with v106 landed (this tree, cache .ab/kc_v106: sparse and dsa groups) against the
# previous main (.ab/main.tgz, cache .kcache), one round, sm_90 plan; its check and sparse GPU suite;
# then ncu SourceCounters (SASS lines with stall samples) of the two kernels issue 20 / 21 still miss
# most on: the B1 L131072 T16 gather (the default at B1) and the dense verify over the DSA pool's
# 656-B rows (glm5_dsa_fp8_sm120) at B1 L131072 T16, and bf16 page-1 verify for comparison.
# Carry .whl_kgen, .kcache, .ab (bench/pending/prep_CD.sh builds them here). ~4 min.
set -u
source bench/pending/steps.sh
root=$PWD
rm -rf /tmp/main_tree && mkdir -p /tmp/main_tree && tar xzf .ab/main.tgz -C /tmp/main_tree
shapes=(--shape 32,32768,16,0.7 --shape 64,8192,16,0.7 --shape 8,131072,16,0.7 --shape 1,131072,16,0.7)
(cd /tmp/main_tree && KC=$root/.kcache step cd_main 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml \
    "${shapes[@]}" --out /tmp/cd_main)
KC=$root/.ab/kc_v106 step cd_v106 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" \
    --check --out /tmp/cd_v106
for f in "$OUT"/cd_*.log; do echo "== $f"; tail -n 8 "$f"; done > "$OUT/tables_cd.log"
KC=$root/.ab/kc_v106 step v106_suite 200 python3 -m pytest -q tests/test_sparse_gpu.py
export KC=$root/.ab/kc_v106
prof() {  # name, kernel regex, profile_one arguments
    local name=$1 regex=$2; shift 2
    step "ncu_$name" 120 ncu --clock-control none -k "regex:$regex" --launch-skip 2 -c 1 --section SourceCounters \
        --section WarpStateStats --section SpeedOfLight --import-source no -o "/tmp/src_$name" \
        python3 -m bench.profile_one --calls 3 "$@"
    ncu --import "/tmp/src_$name.ncu-rep" --page source --print-source sass --csv 2>/dev/null | gzip > "$OUT/sass_$name.csv.gz"
}
prof gather_b1 sparse_g --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072 --gather
prof dsa_dense_b1 '(prefix|verify)_attn' --spec specs/glm5_dsa_fp8_sm120.yaml --shape 1,16,131072
prof bf16_dense_b1 '(prefix|verify)_attn' --spec specs/glm5_sm120.yaml --shape 1,16,131072
rm -f "$OUT"/cd_*.log "$OUT"/ncu_*.log
cat "$OUT/summary.log"
