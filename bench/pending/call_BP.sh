# Call BP: v99 (the gather kernel reads its split's list entries in place, no key list built). The
# sparse GPU suite on both plans with v99 (carried .kcache: `python -m bench.warm .kcache --group
# dsa_pool --group sparse` on this tree), then bench.sparse main / v99 alternating, 2 rounds, on B1 T16,
# B8, T1, B1 no overlap, B2 and B1 L4096. Set-up here first (main = the commit v99 builds on):
#   git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
# Carry .whl_kgen, .kcache and .ab. ~7 min.
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
step sparse_sm90 200 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
step sparse_sm120 200 env KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
t0=$SECONDS
AB_MODULE=bench.sparse AB_TREES=main bash bench/gpu_ab.sh v99 2 --shapes 0,1,3,5,10,8
echo "ab: $((SECONDS - t0)) s" >> "$OUT/summary.log"
