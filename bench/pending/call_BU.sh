# Call BU (for the next session; no GPU came in the forty-seventh): v101 (branch bn64: the sm_90 plan's
# sparse kernels on 16 x 64 tiles, 2 stages, 168 registers; bench/NOTES.md v101) against main, bench.sparse
# alternating; v101 against the float64 reference; the sparse GPU suite on v101 with both plans; then
# call BS's traces of main's union scan (cta_trace point 13: the lists' loads against the inserts).
# Here first: .ab/bn64.tgz (git archive of bn64), .ab/kc_bn64 (bench.warm --group sparse in the bn64
# tree), .ab/kc_main (main's glm5_dsa_sm120 sm_90-plan cubins); carry .whl_kgen and .ab. ~9 min.
set -u
source bench/pending/steps.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> "$OUT/summary.log"
rm -rf /tmp/ab_cache_change /tmp/ab_cache_bn64 /tmp/ab_bn64
cp -r .ab/kc_main /tmp/ab_cache_change && cp -r .ab/kc_bn64 /tmp/ab_cache_bn64
step ab 330 env AB_MODULE=bench.sparse AB_TREES=bn64 bash bench/gpu_ab.sh sparse-v101-ab 2 --shapes 2,1,9,0
# gpu_ab.sh left the bn64 tree in /tmp/ab_bn64: its checks and suites run there, on its cubins
cd /tmp/ab_bn64 && export KC=/tmp/ab_cache_bn64
step check_bn64 150 python3 -m bench.sparse --check --shapes 11,3 --out /tmp/chk
step suite_bn64_sm90 240 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
step suite_bn64_sm120 240 env KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
cd - > /dev/null && export KC=/tmp/kc
for shape in 32,16,32768 8,16,131072; do
    step "trace_${shape//,/_}" 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape "$shape"
done
rm -f "$OUT/ab.log"  # its line is in summary.log: the device returns 8 files
cat "$OUT/summary.log"
