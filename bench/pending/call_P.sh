# Call P: v84 (v83's insert loop votes only while entries are left to hand out). The working tree is v84,
# .ab/v83.tgz main (git archive of main, which has v83). The sparse suite's round and random-batch cases on the sm_120 plan, then one
# bench.sparse round v83 / v84.
set -u
mkdir -p "$OUT"; t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_kgen/*.whl
env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/ab_cache_change KGEN_TEST_PLAN_ARCH=sm_120 timeout 70 python3 -m pytest -q -p no:cacheprovider \
  tests/test_sparse_gpu.py -k "random_batches or rounds or repeated or graph" > "$OUT/sparse120.log" 2>&1
echo "sparse120: rc=$? $((SECONDS - t0)) s: $(tail -n 1 $OUT/sparse120.log)" >> "$OUT/summary.log"
AB_MODULE=bench.sparse AB_TREES="v83" timeout 120 bash bench/gpu_ab.sh sparse 1 --spec specs/glm5_dsa_sm120.yaml --time-limit 20
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
