#!/usr/bin/env bash
# One H200 call for what the open issues built but no GPU has run yet (bench/NOTES.md, "Next
# session's GPU work"), from the repository root, with .whl (bash bench/gpu_wheels.sh) and .kcache
# (python -m bench.warm .kcache) carried; logs and JSON under $OUT. About 6-8 minutes:
#   1. issue 22: kgen's DSA backend against SGLang's and the reference (tests/test_sglang_dsa_gpu.py);
#   2. issue 21: the sparse suite on the shipped per-block spec, then its benchmark and a B=1 profile;
#   3. issue 20: the wgmma loop over fp8 rows against the reference, then timed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
export KGEN_CACHE_DIR="${KGEN_CACHE_DIR:-$PWD/.kcache}" PYTHONUNBUFFERED=1
step() {  # name, seconds, command...: run it under a time limit, say how it ended
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s; $(tail -1 "$out/$name.log")" | tee -a "$out/round.log"
}
step sglang_dsa 150 bash bench/gpu_sglang.sh -k sglang_dsa_gpu -rs  # installs the wheels into /tmp/site
export PYTHONPATH="/tmp/site:$PWD"
step sparse_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_gpu.py
step wgmma_fp8_tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py -k wgmma_loop_over_fp8
# the bf16 rows beside the fp8 ones on the wgmma loop (mma.sync's fp8 times: NOTES v15); compiles
# its specs here (they are not in .kcache: the carry has no room beside the wheels)
step dsa_rows_wgmma 100 python3 -m bench.dsa_rows --fp8-tiles wgmma:32,3,1 --out "$out"
step sparse_bench 60 python3 -m bench.sparse --time-limit 40 --out "$out"
step sparse_profile 30 python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072 --kernels
