# Call CK (fifty-third session): v110, the softmax in every warp (mma_sync tilings with WARP_SOFTMAX 1),
# on the sm_120 plan's dense verify (glm5_sm120, page 1, built for sm_90, the H100's clusters of 2):
# its GPU tests, then an A/B against the row reducers (two rounds alternating). Carry .whl_kgen and
# .kcache (the sparse group and glm5_sm120's sm_120 tilings of tests/test_attention_gpu.py). ~6 min.
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
step tests 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_attention_gpu.py -k every_sm120_tiling
SHAPES=1x131072x16x8,1x32768x16x8,1x131072x16x16,8x32768x64x8,32x4096x16x8
for round in 1 2; do
    for t in reducers:mma_sync:32,32,2,2,1,2 warp:mma_sync:32,32,2,2,1,2,1,0,1; do
        step "ab_${t%%:*}_$round" 150 python3 -m bench.run --spec specs/glm5_sm120.yaml --plan-arch sm_120 \
            --tiles "${t#*:}" --shapes $SHAPES --no-triton --peers none --out "/tmp/ab_${t%%:*}_$round"
    done
done
for f in "$OUT"/ab_*.log; do echo "== $f"; tail -n 14 "$f"; done > "$OUT/ab_table.txt"
cat "$OUT/summary.log"
