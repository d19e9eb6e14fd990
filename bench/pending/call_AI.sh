# Call AI (thirty-ninth session): v92 (the insert loop without a division) against v91b: the sparse GPU
# suite on v92 (this tree), then gpu_ab.sh over bench.sparse, batched shapes first, 2 rounds.
# Carry .whl_kgen and .ab (v91b.tgz = main before v92); ~4 min with the compiles.
set -u
t0=$SECONDS
source bench/pending/steps.sh
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >> "$OUT/summary.log"
env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR=/tmp/ab_cache_change timeout 200 \
    python3 -m pytest -q -m gpu tests/test_sparse_gpu.py > "$OUT/sparse_tests.log" 2>&1
echo "sparse_tests: rc=$? $(tail -n 1 "$OUT/sparse_tests.log")" >> "$OUT/summary.log"
AB_MODULE=bench.sparse AB_TREES="v91b" bash bench/gpu_ab.sh sparse_v92 2 --shapes 2,9,1,7,0,4,5
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
