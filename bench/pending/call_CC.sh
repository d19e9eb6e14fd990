# Call CC: v106 as it lands (LATE_MASKS; this tree, cache .ab/kc_v106) against main (.ab/main.tgz,
# cache .kcache), alternating, sm_90 plan; then v106 against the reference and its sparse GPU suite
# (both plans). Carry .whl_kgen, .kcache, .ab. ~3 min.
set -u
source bench/pending/steps.sh
root=$PWD
rm -rf /tmp/main_tree && mkdir -p /tmp/main_tree && tar xzf .ab/main.tgz -C /tmp/main_tree
shapes=(--shape 32,32768,16,0.7 --shape 64,8192,16,0.7 --shape 8,131072,16,0.7 --shape 1,131072,16,0.7)
for round in 1 2; do
    (cd /tmp/main_tree && KC=$root/.kcache step "cc_main_r$round" 120 python3 -m bench.sparse \
        --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out /tmp/cc_main$round)
    KC=$root/.ab/kc_v106 step "cc_v106_r$round" 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml \
        "${shapes[@]}" --out /tmp/cc_v106$round
done
for f in "$OUT"/cc_*.log; do echo "== $f"; tail -n 20 "$f"; done > "$OUT/tables_cc.log"
rm -f "$OUT"/cc_*_r*.log
KC=$root/.ab/kc_v106 step v106_check 90 python3 -m bench.sparse --check --shape 4,8192,16,0.7 \
    --shape 32,32768,16,0.7 --shape 1,131072,16,0.7 --out /tmp/cc_v106_check
KC=$root/.ab/kc_v106 step v106_suite 200 python3 -m pytest -q tests/test_sparse_gpu.py
cat "$OUT/summary.log"
