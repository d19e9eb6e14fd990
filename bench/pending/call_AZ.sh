# Call AZ (forty-first session): v96 (this tree) against main (.ab/main.tgz, HEAD~1 of v96's commit),
# alternating, 2 rounds; the B1 T16 CTA trace of both; v96's sparse GPU suite (sm_90 plan; the sm_120
# plan's kernels are main's). Set-up: git archive <main> kgen templates bench specs tests pyproject.toml
# ":!bench/results" | gzip > .ab/main.tgz. Carry .whl_kgen and .ab. ~6 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES="main" bash bench/gpu_ab.sh v96 2 --shapes 0,5,6,3,4,1,2
step trace_v96 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
(cd /tmp/ab_main && step trace_main 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072)
step tests_v96 240 python3 -m pytest -q -x -m gpu tests/test_sparse_gpu.py
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
