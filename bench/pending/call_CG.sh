# Call CG (fifty-second session): v108 (this tree: the union's first list loads issued before its hash
# set is cleared; bench/pending/v108-union-loads-before-clear.patch on main) and v108b (.ab/full.tgz:
# v108 + bench/pending/v108b-union-16-byte-clear-compact.patch) against main a2a9025 (.ab/main.tgz):
# bench.sparse's batched shapes, two rounds alternating (the second in reverse order), v108's first
# round with --check; then the sparse GPU suite on this tree. v108b's runs were left out when device
# time ran short (its tree stays in .ab/full.tgz; two `ab` lines time it). Carry .whl_kgen, .kcache
# (bench.warm --group sparse of the three trees) and .ab. ~6 min.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
for t in main; do rm -rf /tmp/t_$t && mkdir -p /tmp/t_$t && tar xzf .ab/$t.tgz -C /tmp/t_$t; done
shapes=(--shape 32,32768,16,0.7 --shape 8,131072,16,0.7)
ab() {  # name, tree, bench.sparse arguments (B64 L8192 left out: device time was short)
    local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 80 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "/tmp/$name" "$@")
}
ab cg_main_r1 /tmp/t_main
ab cg_v108_r1 "$root" --check
ab cg_v108_r2 "$root"
ab cg_main_r2 /tmp/t_main
for f in "$OUT"/cg_*.log; do echo "== $f"; tail -n 6 "$f"; done > "$OUT/tables_cg.log"
step v108_suite 190 python3 -m pytest -q tests/test_sparse_gpu.py
rm -f "$OUT"/cg_*.log
cat "$OUT/summary.log"
