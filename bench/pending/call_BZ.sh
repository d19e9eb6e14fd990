# Call BZ: v105 (the tile's key masks a tile ahead; branch v105-masks-ahead, .ab/v105.tgz with its
# cache .ab/kc_v105) against main (.kcache), alternating, union and gather, sm_90 plan; then v105
# against the reference and (BZ_SUITE=1) its sparse GPU suite. Carry .whl_kgen, .kcache, .ab. ~2 min
# (~4 with the suite).
set -u
source bench/pending/steps.sh
root=$PWD
rm -rf /tmp/v105 && mkdir -p /tmp/v105 && tar xzf .ab/v105.tgz -C /tmp/v105
shapes=(--shape 32,32768,16,0.7 --shape 64,8192,16,0.7 --shape 8,131072,16,0.7 --shape 1,131072,16,0.7)
for round in 1 2; do
    KC=$root/.kcache step "bz_main_r$round" 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml \
        "${shapes[@]}" --out /tmp/bz_main$round
    (cd /tmp/v105 && KC=$root/.ab/kc_v105 step "bz_v105_r$round" 120 python3 -m bench.sparse \
        --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out /tmp/bz_v105$round)
done
for f in "$OUT"/bz_*.log; do echo "== $f"; tail -n 20 "$f"; done > "$OUT/tables_bz.log"
rm -f "$OUT"/bz_*_r*.log
(cd /tmp/v105 && KC=$root/.ab/kc_v105 step v105_check 90 python3 -m bench.sparse --check --shape 4,8192,16,0.7 \
    --shape 32,32768,16,0.7 --shape 1,131072,16,0.7 --out /tmp/bz_v105_check)
[ "${BZ_SUITE:-0}" = 1 ] && (cd /tmp/v105 && KC=$root/.ab/kc_v105 step v105_suite 150 python3 -m pytest -q -x tests/test_sparse_gpu.py)
cat "$OUT/summary.log"
