#!/usr/bin/env bash
# On the GPU machine, from the repository root: the sparse (DSA) GPU tests (both plans, every
# sparse cache format, union and gather kernels), then the sparse benchmark with a reference check
# of every shape, and the sm_120 plan's first shapes. Logs and the benchmark's JSON go to $OUT. Extra arguments go to pytest.
# A carried .kcache/ (cubins built on the CPU machine with the same NVRTC) saves the compiles.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 KGEN_CACHE_DIR="${KGEN_CACHE_DIR:-$PWD/.kcache}"
out="${OUT:-/tmp}"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs --maxfail=12 tests/test_sparse_gpu.py "$@" 2>&1 \
    | tee "$out/sparse_tests.log"
timeout 60 python3 -m bench.sparse --anatomy --out "$out" 2>&1 | tee "$out/sparse_anatomy.log"
timeout 100 python3 -m bench.sparse --check --time-limit 60 --out "$out" 2>&1 | tee "$out/sparse_bench.log"
timeout 50 python3 -m bench.sparse --plan-arch sm_120 --time-limit 15 --out "$out" 2>&1 | tee "$out/sparse_bench_sm120.log"
