# Call BX: the onecopy bound (bench/NOTES.md s49a) and v103 (the producer's rows by cp.async chunks):
# main's sparse kernels against the probe tree .ab/onecopy.tgz (branch probe-onecopy: each key tile
# staged by one bulk copy, wrong results) and .ab/ldg.tgz (branch v103-ldgsts), alternating, union
# and gather, sm_90 plan; then v103's sparse GPU suite. Carry .whl_kgen, .kcache (main's) and .ab
# (the trees and their caches kc_onecopy, kc_ldg; all three trimmed to the product spec's kernels):
# bench/pending/prep_BX.sh builds them here from the patches beside this file.
set -u
source bench/pending/steps.sh
root=$PWD
for t in onecopy ldg; do rm -rf /tmp/$t && mkdir -p /tmp/$t && tar xzf .ab/$t.tgz -C /tmp/$t; done
shapes=(--shape 32,32768,16,0.7 --shape 8,131072,16,0.7 --shape 1,131072,16,0.7)
for round in $(seq "${BX_ROUNDS:-2}"); do
    KC=$root/.kcache step "bx_main_r$round" 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml \
        "${shapes[@]}" --out /tmp/bx_main$round
    for t in ldg onecopy; do
        (cd /tmp/$t && KC=$root/.ab/kc_$t step "bx_${t}_r$round" 120 python3 -m bench.sparse \
            --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out /tmp/bx_$t$round)
    done
done
for f in "$OUT"/bx_*.log; do echo "== $f"; tail -n 20 "$f"; done > "$OUT/tables_bx.log"
rm -f "$OUT"/bx_*_r*.log
(cd /tmp/ldg && KC=$root/.ab/kc_ldg step ldg_check 90 python3 -m bench.sparse --check --shape 4,8192,16,0.7 \
    --shape 1,131072,16,0.7 --out /tmp/bx_ldg_check)
(cd /tmp/ldg && KC=$root/.ab/kc_ldg step ldg_suite 120 python3 -m pytest -q -x tests/test_sparse_gpu.py)
cat "$OUT/summary.log"
