# Call Z (prepared in the thirty-seventh session): v89 (a row tile's splits share one union, built in a
# global table) against main: bench.sparse on the sm_90 plan, 2 rounds; both trees' traces at B1 T16; the
# sparse GPU suite on v89, both plans (its repeated-calls test checks the union tables are empty after
# every call). Set-up (bench/NOTES.md, Next session's GPU work):
#   mkdir -p .ab && git archive HEAD kgen templates bench specs pyproject.toml tests ":!bench/results" | gzip > .ab/main.tgz
#   git apply bench/pending/v89-shared-union.patch   (the working tree, "change")
# carry .ab and .whl_kgen; ~5 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES="main" timeout 220 bash bench/gpu_ab.sh sparse 2 --spec specs/glm5_dsa_sm120.yaml --time-limit 30
echo "ab: $((SECONDS - t0)) s" >> "$OUT/summary.log"
step trace_v89 60 env KGEN_CACHE_DIR=/tmp/ab_cache_change python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
(cd /tmp/ab_main && step trace_main 60 env KGEN_CACHE_DIR=/tmp/ab_cache_main python3 -m bench.cta_trace \
    --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072)
step sparse90 100 env KGEN_CACHE_DIR=/tmp/ab_cache_change python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
step sparse120 150 env KGEN_CACHE_DIR=/tmp/ab_cache_change KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
