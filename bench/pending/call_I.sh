# Call I: v80 (the union's list entries staged in shared memory by cp.async, its scan a short loop)
# and v82 (the tree's tokens listed after a last split's slots: one key range, one tile loop) on the
# sparse kernels. The working tree is main + v75 + v80 + v82 (bench/pending's patches, in that order);
# .ab/v80.tgz the same without v82. The sparse GPU suite on both plans, the trace at B1 L131072 T16,
# then main / v80 / v82 with bench.sparse (sm_90 plan, graph replay). Carry .ab (main.tgz, v80.tgz),
# .whl_kgen and .kc_sparse (python -m bench.warm .kc_sparse --group sparse, from the working tree).
set -u
mkdir -p "$OUT"; t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_kgen/*.whl
step() { local name=$1 limit=$2 s=$SECONDS; shift 2
  env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=$PWD/.kc_sparse timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
step sparse90 110 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_gpu.py
step sparse120 110 env KGEN_TEST_PLAN_ARCH=sm_120 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_gpu.py
step trace 40 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
AB_MODULE=bench.sparse AB_TREES="main v80" timeout $((575 - SECONDS + t0)) bash bench/gpu_ab.sh sparse 2 \
  --spec specs/glm5_dsa_sm120.yaml --time-limit 30
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
