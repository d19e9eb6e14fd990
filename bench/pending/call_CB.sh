# Call CB: v106 (key masks as bytes, held as loaded until the softmax; this tree, cache .ab/kc_v106)
# against main (.ab/main.tgz, cache .kcache), alternating, sm_90 plan; v106 against the reference and
# its sparse GPU suite; then ncu SourceCounters of v106's union at B32 L32768. Carry .whl_kgen,
# .kcache, .ab. ~5 min.
set -u
source bench/pending/steps.sh
root=$PWD
rm -rf /tmp/main_tree && mkdir -p /tmp/main_tree && tar xzf .ab/main.tgz -C /tmp/main_tree
shapes=(--shape 32,32768,16,0.7 --shape 64,8192,16,0.7 --shape 8,131072,16,0.7 --shape 1,131072,16,0.7)
for round in 1 2; do
    (cd /tmp/main_tree && KC=$root/.kcache step "cb_main_r$round" 120 python3 -m bench.sparse \
        --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out /tmp/cb_main$round)
    KC=$root/.ab/kc_v106 step "cb_v106_r$round" 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml \
        "${shapes[@]}" --out /tmp/cb_v106$round
done
for f in "$OUT"/cb_*.log; do echo "== $f"; tail -n 20 "$f"; done > "$OUT/tables_cb.log"
rm -f "$OUT"/cb_*_r*.log
KC=$root/.ab/kc_v106 step v106_check 90 python3 -m bench.sparse --check --shape 4,8192,16,0.7 \
    --shape 32,32768,16,0.7 --shape 1,131072,16,0.7 --out /tmp/cb_v106_check
KC=$root/.ab/kc_v106 step v106_suite 200 python3 -m pytest -q -x tests/test_sparse_gpu.py
KC=$root/.ab/kc_v106 step ncu_src_v106 120 ncu --clock-control none -k regex:sparse_v --launch-skip 2 -c 1 \
    --section SourceCounters --section WarpStateStats --import-source no -o /tmp/src_v106 \
    python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768 --calls 3
ncu --import /tmp/src_v106.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > "$OUT/sass_v106.csv.gz"
cat "$OUT/summary.log"
