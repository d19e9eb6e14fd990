# Call AG (thirty-ninth session): v91 (the union scan's queue through shared addresses) and v91b (the
# slot-range check out of the scan, a pass of its own under KGEN_VALIDATE) against main: the sparse GPU
# suite on v91b (this tree), then gpu_ab.sh over bench.sparse, B1 shapes and B8 / B32, 2 rounds.
# Carry .whl_kgen and .ab (base.tgz = main c61bbfa, v91.tgz = v91); ~8 min with the compiles.
set -u
t0=$SECONDS
source bench/pending/steps.sh
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >> "$OUT/summary.log"
# the suite compiles into the cache gpu_ab.sh gives this tree, so the A/B compiles nothing more for it
env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/ab_cache_change timeout 200 \
    python3 -m pytest -q -m gpu tests/test_sparse_gpu.py > "$OUT/sparse_tests.log" 2>&1
echo "sparse_tests: rc=$? $(tail -n 1 "$OUT/sparse_tests.log")" >> "$OUT/summary.log"
AB_MODULE=bench.sparse AB_TREES="base v91" bash bench/gpu_ab.sh sparse_v91 2 --shapes 0,5,6,4,8,3,1,2
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
