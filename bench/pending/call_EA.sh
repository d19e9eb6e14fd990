# Call EA (fifty-fifth session): (1) bench.gather_probe: what moving B = 1's key rows costs with
# nothing else in the kernel (bench/NOTES.md s55a); (2) the sparse GPU suite on both plans, with the
# 4-head rounds test (a 4-token tile's 8,192 slots in two rounds of the union's set); (3) the sm_120
# plan's sparse table with FlashMLA's padded sparse decode beside it (the fifty-fourth session's
# item 2). Carry .whl_kgen, .whl_peers and .kcache (python -m bench.warm .kcache --group sparse). ~7 min.
set -u
source bench/pending/steps.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_peers/*.whl
export KC=$PWD/.kcache
step probe 150 python3 -m bench.gather_probe --out "$OUT"
step suite 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_sparse_gpu.py
step table_sm120 200 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml --plan-arch sm_120 --time-limit 150 --out "$OUT"
cat "$OUT/summary.log"
