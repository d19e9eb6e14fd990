# Call AY (forty-first session): s41b / s41c / s41d against "sorted" (main on lists in slot_hash order),
# alternating, 2 rounds (bench/NOTES.md s41a). Set-up (CPU): .ab/{sorted,bound_b,bound_c,loads4}.tgz, each
# HEAD + s41a-sorted-lists.patch + (s41b-bound-pow2-windows.patch | + s41c-bound-loads4.patch | s41d-loads4.patch).
# Carry .whl_kgen and .ab. ~5 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_CHANGE= AB_MODULE=bench.sparse AB_TREES="sorted bound_b bound_c loads4" bash bench/gpu_ab.sh s41b 2 --shapes 0,5,6,4,1,2
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
