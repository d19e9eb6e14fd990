# Call AX (forty-first session): the s41a bound. main on its own lists, "sorted" (main on lists in
# slot_hash order) and "bound" (the windowed scan, wrong results) alternating, 2 rounds. Set-up (CPU):
#   rm -rf .ab && mkdir .ab && for v in sorted bound; do rm -rf /tmp/t_$v && mkdir /tmp/t_$v &&
#     git archive HEAD | tar x -C /tmp/t_$v && (cd /tmp/t_$v && patch -p1 -s < $OLDPWD/bench/pending/s41a-sorted-lists.patch &&
#     if [ $v = bound ]; then patch -p1 -s < $OLDPWD/bench/pending/s41a-bound-windowed-scan.patch; fi &&
#     tar czf $OLDPWD/.ab/$v.tgz kgen templates bench specs tests pyproject.toml); done
# Carry .whl_kgen and .ab. ~4 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES="sorted bound" bash bench/gpu_ab.sh s41a 2 --shapes 0,5,6,4,1,8
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
