# Call BX: the onecopy bound (bench/NOTES.md s49a): main's sparse kernels against the probe tree
# .ab/onecopy.tgz (branch probe-onecopy: each key tile staged by one bulk copy of the tile's bytes, not
# one bulk copy a row; wrong results), alternating, union and gather, sm_90 plan. Carry .whl_kgen,
# .kcache (main's bench.warm --group sparse) and .ab (onecopy.tgz, kc_onecopy: the probe's). ~3 min.
set -u
source bench/pending/steps.sh
root=$PWD
rm -rf /tmp/oc && mkdir -p /tmp/oc && tar xzf .ab/onecopy.tgz -C /tmp/oc
shapes=(--shape 32,32768,16,0.7 --shape 8,131072,16,0.7 --shape 1,131072,16,0.7)
for round in 1 2; do
    KC=$root/.kcache step "bx_main_r$round" 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml \
        "${shapes[@]}" --out /tmp/bx_main$round
    (cd /tmp/oc && KC=$root/.ab/kc_onecopy step "bx_onecopy_r$round" 120 python3 -m bench.sparse \
        --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out /tmp/bx_onecopy$round)
done
for f in "$OUT"/bx_*.log; do echo "== $f"; tail -n 20 "$f"; done > "$OUT/tables_bx.log"
rm -f "$OUT"/bx_*_r*.log
cat "$OUT/summary.log"
