# Call BS (for the next session): where the union's scan spends its ~1,200 cycles an insert (bench/NOTES.md
# v100's reading): cta_trace's new point 13 (thread 0's last step loaded, tested and queued) splits the
# scan into the lists' loads and the inserts, at B32 L32768 (1 split a row tile) and B8 L131072 (4).
# Build .kcache here first (`python -m bench.warm .kcache --group sparse`); carry .whl_kgen and .kcache.
# ~1.5 min after the start (the traced kernels compile there).
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
for shape in 32,16,32768 8,16,131072 64,16,8192; do
    step "trace_${shape//,/_}" 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape "$shape"
done
