# Call EI (fifty-seventh session): the union's insert with fewer instructions on its chain, against
# main (bench/NOTES.md v115a-c): v115a, the probe one CAS (no load first); v115b, a slot's probe
# position from one multiply (no murmur finalizer); v115c, both. bench.union_build_probe over the four
# trees' templates (two rounds), then bench.sparse for v115c and main at five shapes (B64 L8192 is
# the shape a clustering probe hash slowed: bench/NOTES.md mix32), two rounds in turn (v115c's first
# with --check), then v115c's sparse GPU suite. Before the call, here: .ab/v115{a,b,c}.tgz (each
# branch's kgen templates bench specs tests), .kcache warmed in main's and v115c's trees. Carry
# .whl_kgen, .kcache, .ab. ~3 min.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
for v in a b c; do rm -rf "/tmp/t_115$v" && mkdir -p "/tmp/t_115$v" && tar xzf ".ab/v115$v.tgz" -C "/tmp/t_115$v"; done
for r in 1 2; do
    step "probe_main_r$r" 60 python3 -m bench.union_build_probe --templates "$root/templates" --out "$OUT/probe_main_r$r"
    for v in a b c; do
        step "probe_v115${v}_r$r" 60 python3 -m bench.union_build_probe --templates "/tmp/t_115$v/templates" --out "$OUT/probe_v115${v}_r$r"
    done
done
shapes=(--shape 32,32768,16,0.7 --shape 8,131072,16,0.7 --shape 8,32768,16,0.5 --shape 64,8192,16,0.7
        --shape 1,131072,16,0.7)
ab() { local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 120 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "$OUT/$name" "$@"); }
ab v115c_r1 /tmp/t_115c --check
ab main_r1 "$root"
ab v115c_r2 /tmp/t_115c
ab main_r2 "$root"
(cd /tmp/t_115c && step suite_v115c 150 python3 -m pytest -q -x tests/test_sparse_gpu.py)
{ for f in "$OUT"/probe_*.log; do echo "== $f"; grep '"design": "split16"' "$f" | cut -c1-110; done
  for f in "$OUT"/main_r*.log "$OUT"/v115c_r*.log; do echo "== $f"; tail -n 7 "$f" | cut -c1-120; done
  cat "$OUT/summary.log"; } > "$OUT/all.txt"
(cd "$OUT" && tar czf results.tgz probe_* main_r* v115c_r* && rm -rf probe_* main_r* v115c_r*)  # few files come back
cat "$OUT/all.txt"
