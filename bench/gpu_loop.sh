#!/usr/bin/env bash
# (GPU, H200) The overlap loop (issue 19; bench/NOTES.md v15), in one go, logs under $OUT:
#   1. every sm_120 tiling (row-block and overlap loops) against the float64 reference;
#   2. H200 timings of the row-block loop (the sm_120 plan), the overlap variants and the wgmma
#      loop (for its model entry)
#      at compute-bound, memory-bound and small shapes (bench.model_validate: graph replays over
#      rotated inputs), the measurements the model is refit on (python -m bench.model_table);
#   3. ncu counters of one call of the overlap and row-block loops (compute- and memory-bound);
#   4. the attention, step and fp8 GPU tests with the sm_120 plan (KGEN_TEST_PLAN_ARCH=sm_120), half
#      of the random cases (cut short by its timeout if the budget is spent).
# Each step has its own timeout; a step that fails does not stop the next.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kgen_loop}
mkdir -p "$OUT"
export KGEN_CACHE_DIR=${KGEN_CACHE_DIR:-$OUT/kcache}
step() {  # name, timeout seconds, command...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s; $(tail -n 1 "$OUT/$name.log")"
}
step tilings 110 python -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py -k every_sm120_tiling
step timing 170 python -m bench.model_validate --out "$OUT/model_validate.json" \
    --variants sm120_plan,overlap,overlap16,overlap16_s3,overlap32,overlap32_s3,sm120_plan_tp4,overlap_tp4,overlap32_tp4,wgmma4 \
    --shapes compute,compute_l32k,compute_b8,compute_t64,compute_b8_t64,small,small_b32,memory,h16_compute,h16_b16_t33
step ncu 150 python -m bench.model_validate --out "$OUT/model_validate_ncu.json" --ncu \
    --variants sm120_plan,overlap,overlap32 --shapes compute
step sm120_plan_tests 150 env KGEN_TEST_PLAN_ARCH=sm_120 KGEN_TEST_RANDOM_SCALE=0.3 \
    python -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py tests/test_step_gpu.py tests/test_fp8_gpu.py \
    -k "not every_sm120_tiling"
grep -h "us$" "$OUT/timing.log" || true
