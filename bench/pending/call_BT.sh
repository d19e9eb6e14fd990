# Call BT (forty-seventh session): call BS's traces (where the union's scan spends its time: point 13
# splits the lists' loads from the inserts) and the BN probe: how a 32-key tile's time a CTA splits
# into a part per tile and a part per key, from bf16 rows (K_BLOCK 16 allows BN = 16) on 16-row tiles
# two CTAs an SM at equal ring bytes: BN 32 x 2 stages against BN 16 x 4 (bench/NOTES.md s47a).
# Build .kcache first (bench.warm --group sparse, and the probe's tilings); carry .whl_kgen and .kcache.
set -u
[ -d .kcache ] && export KC=$PWD/.kcache
source bench/pending/steps.sh
for shape in 32,16,32768 8,16,131072 64,16,8192; do
    step "trace_${shape//,/_}" 120 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape "$shape"
done
S=bench/pending/bn_probe/glm5_dsa_bf16.yaml
for r in 1 2; do
    for t in 16,32,1,2,2 16,16,1,4,2; do
        step "bn_${t//,/_}_r$r" 150 python3 -m bench.sparse --spec $S --tiles mma_sync:$t --shapes 2,1,9,0 --out /tmp/bn
    done
done
cd "$OUT" && tar czf bn.tgz -C /tmp bn && cat summary.log
