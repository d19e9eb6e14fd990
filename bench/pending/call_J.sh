# Call J: v82 alone (the tree's tokens listed after a last split's slots: one key range, one tile loop)
# on main's sparse kernels: main / v82 with bench.sparse (sm_90 plan, graph replay), then v82's sparse
# GPU suite. Build .ab/main.tgz from main and .ab/v82a.tgz from main + bench/pending/v82-sparse-tree-in-
# list.patch (`git archive HEAD kgen templates bench specs pyproject.toml ":!bench/results"`, the second
# after `git apply` with tar of the same paths); carry .ab and .whl_kgen.
set -u
mkdir -p "$OUT"; t0=$SECONDS
AB_CHANGE= AB_MODULE=bench.sparse AB_TREES="main v82a" timeout 300 bash bench/gpu_ab.sh sparse 2 \
  --spec specs/glm5_dsa_sm120.yaml --time-limit 30
cp -r tests /tmp/ab_v82a/ && cd /tmp/ab_v82a && PYTHONPATH=/tmp/site:/tmp/ab_v82a KGEN_CACHE_DIR=/tmp/ab_cache_v82a \
  timeout $((560 - SECONDS + t0)) python3 -m pytest -q -p no:cacheprovider tests/test_sparse_gpu.py > "$OUT/sparse90.log" 2>&1
echo "sparse90 rc=$? $(tail -n 1 "$OUT/sparse90.log"); done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
