# Call G (s30a): where the sm_120 plan's tile goes on the H200, by bounds: main / nocopy (the producer
# arrives on each full barrier with no bytes) / nocompute (the consumers only wait and free);
# glm5_sm120, page 1, the sm_120 plan's tiling forced unclustered, graph replay of prepared steps.
set -u
mkdir -p "$OUT"; t0=$SECONDS
AB_CHANGE= AB_TREES="main nocopy nocompute" timeout 560 bash bench/gpu_ab.sh s30a 2 --spec specs/glm5_sm120.yaml \
  --plan-arch sm_120 --tiles mma_sync:32,32,2,2,1 --no-halves --time-limit 40 \
  --shapes 1x131072x16x8,1x32768x16x8,8x32768x16x8,1x32768x64x8,32x4096x16x8,1x131072x1x8
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
