# Call AL (fortieth session): v93b (two Q·K chains, no producer warp) against v93 (no producer warp)
# and main's tiling, alternating, 2 rounds, bench.sparse. Carry .whl_kgen and .ab (v93.tgz). ~4 min.
set -u
t0=$SECONDS
source bench/pending/steps.sh
rm -rf /tmp/ab_v93 && mkdir -p /tmp/ab_v93 && tar xzf .ab/v93.tgz -C /tmp/ab_v93
run() { local name=$1 dir=$2 tiles=$3 s=$SECONDS
  (cd "$dir" && env PYTHONPATH=/tmp/site:$dir KGEN_CACHE_DIR=/tmp/kc_$name timeout 100 python3 -m bench.sparse \
      --tiles "$tiles" --shapes 2,9,1,0,5,4 --out /tmp/res) > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s" >> "$OUT/summary.log"; }
for r in 1 2; do
  run "main_$r" "$PWD" mma_sync:32,32,2,4,1
  run "v93_$r" /tmp/ab_v93 mma_sync:32,32,2,4,1,1,1,0,0
  run "v93b_$r" "$PWD" mma_sync:32,32,2,4,1,1,1,0,0
done
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
