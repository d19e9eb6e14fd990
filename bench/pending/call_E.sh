# Call E: v75 (the sm_90 consumers fence only generic-proxy stages) main / change on bf16 page 64 and
# per-tensor fp8 rows (sm_90 plan), graph replay of prepared steps.
set -u
mkdir -p "$OUT"; t0=$SECONDS
AB_TREES=main timeout 330 bash bench/gpu_ab.sh p64 2 --spec specs/glm5_p64_sm120.yaml \
  --shapes 1x131072x16x8,1x131072x16x16,8x32768x64x8,32x4096x1x8,16x32768x33x16 --time-limit 45 --no-halves
echo "p64: $((SECONDS - t0)) s" >> "$OUT/summary.log"
AB_TREES=main timeout $((560 - SECONDS + t0)) bash bench/gpu_ab.sh fp8 2 --spec specs/glm5_fp8_sm120.yaml \
  --shapes 1x131072x16x8,8x32768x64x8,1x131072x16x16 --time-limit 30 --no-halves
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
