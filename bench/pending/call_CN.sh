# Call CN (fifty-third session): v111 (the compute warps stage the ring's first tiles of a range,
# beside the producer) against main (.ab/main.tgz, cb0e64c's kernels = a2a9025's): bench.sparse on six
# shapes (two rounds alternating, v111's first with --check), the sparse GPU suite and every sm_120
# tiling's dense tests on v111, then v111's tile timeline at B1 T16 and T1. Carry .whl_kgen,
# .kcache (/tmp/ws/warm_v111.py of both trees, the traced v111 build) and .ab. ~5 min.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
rm -rf /tmp/t_main && mkdir -p /tmp/t_main && tar xzf .ab/main.tgz -C /tmp/t_main
shapes=(--shape 1,131072,16,0.7 --shape 1,131072,1,0.7 --shape 2,131072,16,0.7 --shape 1,4096,16,0.7
        --shape 8,131072,16,0.7 --shape 32,32768,16,0.7)
ab() {  # name, tree, bench.sparse arguments
    local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 100 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "/tmp/$name" "$@")
}
ab main_r1 /tmp/t_main
ab v111_r1 "$root" --check
ab v111_r2 "$root"
ab main_r2 /tmp/t_main
for f in "$OUT"/main_r*.log "$OUT"/v111_r*.log; do echo "== $f"; tail -n 12 "$f"; done > "$OUT/tables.log"
step suite 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
step dense 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_attention_gpu.py -k every_sm120_tiling
step trace_b1 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
step trace_t1 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,1,131072
cat "$OUT/summary.log"
