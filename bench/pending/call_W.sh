# Call W (prepared in the thirty-sixth session): v87 (each split's union scan starts at its own share of
# the lists) against main, bench.sparse on the sm_90 plan, 2 rounds; the sparse GPU suite on v87, both
# plans; v87's trace at B1 T16. Set-up (bench/NOTES.md, Next session's GPU work):
#   git archive HEAD kgen templates bench specs pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   git apply bench/pending/v87-union-scan-rotated-by-split.patch   (the working tree, "change")
# carry .ab and .whl_kgen; ~5 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES="main" timeout 220 bash bench/gpu_ab.sh sparse 2 --spec specs/glm5_dsa_sm120.yaml --time-limit 30
echo "ab: $((SECONDS - t0)) s" >> "$OUT/summary.log"
step trace_b1 60 env KGEN_CACHE_DIR=/tmp/ab_cache_change python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
step sparse120 150 env KGEN_CACHE_DIR=/tmp/ab_cache_change KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
step sparse90 100 env KGEN_CACHE_DIR=/tmp/ab_cache_change python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
