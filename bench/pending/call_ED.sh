# Call ED (fifty-sixth session): call EC's A/B of v113 against main (two rounds alternating), then s56a's
# key-list build probe, then the sparse GPU suite on v113. Carry .whl_kgen, .kcache (both trees warmed), .ab.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
rm -rf /tmp/t_main && mkdir -p /tmp/t_main && tar xzf .ab/main.tgz -C /tmp/t_main
shapes=(--shape 1,131072,16,0.7 --shape 1,131072,1,0.7 --shape 1,131072,64,0.5 --shape 8,131072,16,0.7
        --shape 32,32768,16,0.7)
ab() {  # name, tree, bench.sparse arguments
    local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 90 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "/tmp/$name" "$@")
}
ab v113_r1 "$root" --check
ab main_r1 /tmp/t_main
ab main_r2 /tmp/t_main
ab v113_r2 "$root"
for f in "$OUT"/main_r*.log "$OUT"/v113_r*.log; do echo "== $f"; tail -n 8 "$f"; done > "$OUT/tables.log"
step build_probe 120 python3 -m bench.union_build_probe --out "$OUT"
step suite 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
cat "$OUT/tables.log" "$OUT/build_probe.log" "$OUT/summary.log"
