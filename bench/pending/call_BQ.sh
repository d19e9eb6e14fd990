# Call BQ (for the next session): the sparse GPU suite on the final commit (the gather's workspace
# without a key-list region, dace1b4, is host-side and was not run on a GPU), then cta_trace's phases
# of the default step where it runs the union (B8 L131072, B32 L32768: what its key list costs batched,
# bench/NOTES.md "Next session's GPU work (after the forty-fifth session)") and where it runs the gather
# (B1 L131072 T16: v99's new chain). Build .kcache here first (`python -m bench.warm .kcache --group
# dsa_pool --group sparse`); carry .whl_kgen and .kcache. ~4 min (the traced kernels compile there).
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
step sparse 240 python3 -m pytest -q -x -rs -m gpu tests/test_sparse_gpu.py
for shape in 8,16,131072 32,16,32768 1,16,131072; do
    step "trace_${shape//,/_}" 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape "$shape"
done
