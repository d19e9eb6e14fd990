# Call BU (forty-seventh session): call BS's scan traces on main, then v101 (branch bn64: the sparse
# kernels on 16 x 64 tiles, 2 stages, 200 registers) against main, bench.sparse alternating (bench/NOTES.md
# v101). Carry .whl_kgen, .kcache (main's sparse group) and .ab (bn64.tgz, kc_bn64: its cubins).
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> "$OUT/summary.log"
rm -rf /tmp/ab_cache_change /tmp/ab_cache_bn64
cp -r .kcache /tmp/ab_cache_change && cp -r .ab/kc_bn64 /tmp/ab_cache_bn64
mkdir -p /tmp/ab_bn64 && tar xzf .ab/bn64.tgz -C /tmp/ab_bn64
step ab 330 env AB_MODULE=bench.sparse AB_TREES=bn64 bash bench/gpu_ab.sh sparse-v101-ab 2 --shapes 2,1,9,0
# v101's results against the float64 reference (two shapes, both kernels)
(cd /tmp/ab_bn64 && KC=/tmp/ab_cache_bn64 && step check_bn64 150 python3 -m bench.sparse --check --shapes 11 --out /tmp/chk)
for shape in 32,16,32768 8,16,131072; do  # the second only if time is left
    step "trace_${shape//,/_}" 100 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape "$shape"
done
cat "$OUT/summary.log"
