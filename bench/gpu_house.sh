#!/bin/bash
# GPU check of the house refactor (issue 17): every GPU test, with the H200's own plan and then with
# the sm_120 plan, after compiling their kernels in parallel. Run from the repository root; logs in $OUT.
set -u
OUT=${OUT:-/tmp/out_house}
mkdir -p "$OUT"
export KGEN_CACHE_DIR=${KGEN_CACHE_DIR:-/tmp/kgen_cache_house}
export PYTHONPATH=$PWD
start=$(date +%s)
# The kernels the tests load (shipped and derived specs, both plans, cubins for the GPU present),
# compiled 12 at a time: the tests would compile them one by one.
timeout 200 python - <<'PY' 2>&1 | tee "$OUT/warm.log"
import sys
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, "tests")
from conftest import DERIVED_SPECS, SPEC_DIR, spec_named
from kgen.build import build_variant
from kgen.cache import KernelCache
from kgen.plan import plan

def one(job):
    name, plan_arch, variant = job
    b = build_variant(plan(spec_named(name), plan_arch).variant(variant), "sm_90", KernelCache())
    return f"{name} {plan_arch} {variant}: {b.status}"

names = [p.stem for p in sorted(SPEC_DIR.glob("*.yaml"))] + list(DERIVED_SPECS)
jobs = [(n, a, v.name) for n in names for a in ("sm_90", "sm_120") for v in plan(spec_named(n), a).variants]
with ProcessPoolExecutor(12) as pool:
    for line in pool.map(one, jobs):
        print(line, flush=True)
PY
echo "warm: $(( $(date +%s) - start )) s" | tee -a "$OUT/job.log"
timeout 240 python -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu_own_plan.log" | tail -30
echo "own plan: rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s; $(tail -1 "$OUT/gpu_own_plan.log")" | tee -a "$OUT/job.log"
KGEN_TEST_PLAN_ARCH=sm_120 KGEN_TEST_RANDOM_SCALE=0.3 timeout 150 python -m pytest -q -m gpu tests 2>&1 \
    | tee "$OUT/gpu_sm120_plan.log" | tail -30
echo "sm_120 plan: rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s; $(tail -1 "$OUT/gpu_sm120_plan.log")" \
    | tee -a "$OUT/job.log"
