# Call EG (prepared in the fifty-sixth session): two ways to shorten the union's key-list inserts
# (bench/NOTES.md s56a: ~4.4 ns a CTA an entry, a dependent chain a warp), each against main:
#   v114b (bench/pending/v114b-bulk-insert.patch): v114's bulk rounds with plain, batched shared loads;
#   v114c (bench/pending/v114c-two-in-flight.patch): two insert chains in flight a lane.
# bench.union_build_probe over the three trees' templates, then bench.sparse at five shapes, two rounds
# in turn (each variant's first with --check). Before the call, here (main checked out, clean):
#   git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   for v in b c; do rm -rf /tmp/t_$v; mkdir -p /tmp/t_$v; tar xzf .ab/main.tgz -C /tmp/t_$v; \
#     (cd /tmp/t_$v && git apply /work/main/bench/pending/v114$v-*.patch \
#      && KGEN_CACHE_DIR=/tmp/kc_$v python -m bench.warm /work/main/.kcache --group sparse); done
#   KGEN_CACHE_DIR=/tmp/kc_m python -m bench.warm .kcache --group sparse
# Carry .whl_kgen, .kcache, .ab. ~4 min, then each variant's sparse GPU suite (<= 130 s each).
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
for v in b c; do
    rm -rf "/tmp/t_$v" && mkdir -p "/tmp/t_$v" && tar xzf .ab/main.tgz -C "/tmp/t_$v"
    (cd "/tmp/t_$v" && git apply "$root"/bench/pending/v114$v-*.patch) || echo "v114$v: patch failed" >> "$OUT/summary.log"
done
tree() { case $1 in main) echo "$root";; *) echo "/tmp/t_${1#v114}";; esac; }
for t in main v114b v114c; do
    step "probe_$t" 60 python3 -m bench.union_build_probe --templates "$(tree $t)/templates" --out "$OUT/probe_$t"
done
shapes=(--shape 1,131072,16,0.7 --shape 1,131072,1,0.7 --shape 8,131072,16,0.7 --shape 32,32768,16,0.7
        --shape 8,32768,16,0.5)
ab() { local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 90 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "$OUT/$name" "$@"); }
ab v114b_r1 "$(tree v114b)" --check
ab v114c_r1 "$(tree v114c)" --check
ab main_r1 "$root"
ab v114b_r2 "$(tree v114b)"
ab v114c_r2 "$(tree v114c)"
ab main_r2 "$root"
for t in v114b v114c; do  # each variant's sparse GPU suite, if time is left (the call's limit is 600 s)
    (cd "$(tree $t)" && step "suite_$t" 130 python3 -m pytest -q -x tests/test_sparse_gpu.py)
done
for f in "$OUT"/main_r*.log "$OUT"/v114*_r*.log; do echo "== $f"; tail -n 7 "$f" | cut -c1-120; done > "$OUT/tables.log"
grep -h '"design"' "$OUT"/probe_*.log | cut -c1-130
cat "$OUT/tables.log" "$OUT/summary.log"
