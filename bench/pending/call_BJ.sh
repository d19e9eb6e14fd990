# Call BJ (for the next session): v98 (bench/pending/v98-sparse-attention-pdl.patch: the sparse
# attention kernels launched to overlap the kernel before them) and v98b (v98 and, before the wait,
# the schedule table's first lines fetched into L2) against main, bench.sparse on five shapes (B1 T16,
# B8, T1, B1 no overlap, B2), 2 rounds alternating. Set-up here first:
#   git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   git apply bench/pending/v98-sparse-attention-pdl.patch
#   git archive --prefix= $(git stash create) kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/v98.tgz
#   git checkout kgen templates generated && git apply bench/pending/v98b-sparse-attention-pdl-l2-prefetch.patch
# Carry .whl_kgen (pydantic's wheels only: without sgl_flash_mla, bench.sparse skips FlashMLA and
# keeps within the call) and .ab. ~7 min. Then call BK (on whichever of v98 / v98b is kept).
set -u
t0=$SECONDS
mkdir -p "$OUT"
AB_MODULE=bench.sparse AB_TREES="main v98" bash bench/gpu_ab.sh v98 2 --shapes 0,1,3,5,10
echo "ab: $((SECONDS - t0)) s" >> "$OUT/summary.log"
