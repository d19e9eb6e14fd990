# Call BR (forty-sixth session): v100 (the union's insertion queue holds each entry's slot and token:
# bench/NOTES.md v100) on the GPU: the sparse GPU suite, an A/B against main (fae04b5) on the union's
# batched shapes and B1 T16 (bench.sparse shapes 1, 2, 9, 0; two rounds alternating), cta_trace at B32.
# Build .kcache here (`python -m bench.warm .kcache --group sparse --group dsa_pool`) and .ab (main.tgz
# and main's sm_90-plan cubins in .ab/kc_main); carry .whl_kgen, .kcache, .ab. ~6 min.
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
step sparse 240 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
mkdir -p /tmp/ab_cache_main /tmp/ab_cache_change
cp -r .ab/kc_main/. /tmp/ab_cache_main/ && cp -r .kcache/. /tmp/ab_cache_change/
step ab 400 env AB_MODULE=bench.sparse AB_TREES=main bash bench/gpu_ab.sh v100-ab 2 --shapes 1,2,9,0
step trace_32_16_32768 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768
