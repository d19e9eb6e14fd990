# Call BO (for the next session): what the forty-third session left. The sm_90 plan's DSA-pool GPU
# file on the final kernels (its compiles outran call BM's 150 s step), then v97's rule's edge at B = 1:
# union against gather over T at 0.5 and 0.7 shared (call BL: at T64 0.5 the union, which the default
# step runs, took 42.9 us where the gather took 41.6). Carry .whl_kgen and .kcache, built here first
# (`python -m bench.warm .kcache --group dsa_pool --group sparse`: the cubins both steps load, so the
# device compiles nothing; without it the first step's compiles outran 150 s). ~3 min with .kcache
# (the file's SGLang writer check skips without sglang: bench/gpu_sglang.sh runs it).
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
step dsa_pool_sm90 330 python3 -m pytest -q -x -rs -m gpu tests/test_dsa_pool_gpu.py
shapes=()
for t in 8 16 24 32 48 64; do for s in 0.5 0.7; do shapes+=(--shape "1,131072,$t,$s"); done; done
step rule_edge 200 python3 -m bench.sparse "${shapes[@]}" --out "$OUT"
