# Call AV (for the next session): v95b (the union's scan shared by a cluster of 2 splits, entries
# shipped to the owner's inbox: bench/pending/v95b-cluster-inbox-scan.patch) and v95-diag (v95b's
# clusters, order and even splits with the scan not shared: ...v95-diag-clusters-only.patch on top)
# against this tree, bench.sparse alternating, 2 rounds; then v95b's sparse GPU suite (sm_90 plan:
# the sm_120 plan has no clusters). Set-up here first (CPU), then carry .whl_kgen and .ab:
#   rm -rf .ab && mkdir .ab && for v in v95b diag; do rm -rf /tmp/t_$v && mkdir /tmp/t_$v &&
#     git archive HEAD | tar x -C /tmp/t_$v && (cd /tmp/t_$v && patch -p1 -s < $OLDPWD/bench/pending/v95b-cluster-inbox-scan.patch &&
#     if [ $v = diag ]; then patch -p1 -s < $OLDPWD/bench/pending/v95-diag-clusters-only.patch; fi &&
#     tar czf $OLDPWD/.ab/$v.tgz kgen templates bench specs tests pyproject.toml); done
# ~6 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES="v95b diag" bash bench/gpu_ab.sh v95b 2 --shapes 0,5,6,4,1,7,2
(cd /tmp/ab_v95b && step tests_v95b 240 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py)
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
