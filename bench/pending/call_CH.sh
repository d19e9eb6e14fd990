# Call CH (fifty-second session): v108b (.ab/full.tgz) against main (.ab/main.tgz), bench.sparse's
# batched shapes, two rounds alternating, v108b's first with --check. Carry as call CG. ~1.5 min.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
for t in main full; do rm -rf /tmp/t_$t && mkdir -p /tmp/t_$t && tar xzf .ab/$t.tgz -C /tmp/t_$t; done
shapes=(--shape 32,32768,16,0.7 --shape 64,8192,16,0.7 --shape 8,131072,16,0.7)
ab() {  # name, tree, bench.sparse arguments
    local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 60 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "/tmp/$name" "$@")
}
ab ch_full_r1 /tmp/t_full --check
ab ch_main_r1 /tmp/t_main
ab ch_main_r2 /tmp/t_main
ab ch_full_r2 /tmp/t_full
for f in "$OUT"/ch_*.log; do echo "== $f"; tail -n 6 "$f"; done > "$OUT/tables_ch.log"
rm -f "$OUT"/ch_*.log
cat "$OUT/summary.log"
