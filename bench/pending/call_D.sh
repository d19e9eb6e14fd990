# Call D: the sm_90 loops the change touches (DSA rows, page-64 bf16, per-tensor fp8) against the
# reference, then main / change on the DSA rows' main shapes.
set -u
t0=$SECONDS
source bench/pending/steps.sh
step loops 230 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py tests/test_dsa_pool_gpu.py \
  -k "sm90_loops or (random_batches and (p64 or dsa_fp8)) or (long_prefixes and dsa_fp8) or block_scales or tree_keys"
AB_TREES=main timeout $((470 - SECONDS + t0)) bash bench/gpu_ab.sh dsa 2 --spec specs/glm5_dsa_fp8_sm120.yaml \
  --shapes 1x131072x16x8,8x32768x64x8,1x131072x16x16 --time-limit 40 --no-halves
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
