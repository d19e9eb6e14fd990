# Call BV: v102 (branch qsmem: the sm_90 plan's sparse kernels three CTAs an SM, Q's fragments in shared
# memory; bench/NOTES.md v102) against main, bench.sparse alternating; v102 against the float64 reference;
# the sparse GPU suite on v102 (sm_90 plan: the sm_120 plan's kernels are SASS-identical to main's).
# Here first: .ab/qs.tgz (git archive of qsmem), .ab/kc_qs (bench.warm --group sparse in the qsmem tree
# and its glm5_dsa_sm120 sm_90-plan cubins), .ab/kc_main; carry .whl_kgen and .ab. ~7 min.
set -u
source bench/pending/steps.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> "$OUT/summary.log"
rm -rf /tmp/ab_cache_change /tmp/ab_cache_qs /tmp/ab_qs
cp -r .ab/kc_main /tmp/ab_cache_change && cp -r .ab/kc_qs /tmp/ab_cache_qs
step ab 330 env AB_MODULE=bench.sparse AB_TREES=qs bash bench/gpu_ab.sh sparse-v102-ab 2 --shapes 2,1,9,0
cd /tmp/ab_qs && export KC=/tmp/ab_cache_qs
step check_qs 150 python3 -m bench.sparse --check --shapes 2,11,3 --out /tmp/chk
step suite_qs_sm90 240 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
cd - > /dev/null
rm -f "$OUT/ab.log"
cat "$OUT/summary.log"
