# Call EI (prepared in the fifty-seventh session; not yet run): the union's key list with fewer
# instructions on its chains, against main (bench/NOTES.md v115a-d): v115a, the probe one CAS (no load
# first; bench/pending/v115a-cas-first.patch); v115b, a slot's probe position from one multiply (no
# murmur finalizer; v115b-one-multiply-home.patch); v115c, both; v115d, v115c and compact() loading
# two chunks before writing (v115d-compact-batched.patch on top). First s57b: bench.gather_probe's
# rows alone at B8. Then bench.union_build_probe over the five trees' templates, bench.sparse for
# v115d and main at five shapes (B64 L8192 is the shape a clustering probe hash slowed: bench/NOTES.md
# mix32), in turn (bench/gpu_ab.sh, each run --check'd), and v115d's sparse GPU suite. Before the call, here
# (main checked out, clean; ~3 min):
#   git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   for v in a b c d; do rm -rf /tmp/t_115$v; mkdir -p /tmp/t_115$v; tar xzf .ab/main.tgz -C /tmp/t_115$v; done
#   (cd /tmp/t_115a && git apply /work/main/bench/pending/v115a-*.patch)
#   (cd /tmp/t_115b && git apply /work/main/bench/pending/v115b-*.patch)
#   (cd /tmp/t_115d && git apply /work/main/bench/pending/v115[ab]-*.patch)
#   (cd /tmp/t_115d && git apply /work/main/bench/pending/v115[abd]-*.patch)
#   for v in a b c d; do (cd /tmp/t_115$v && tar czf /work/main/.ab/v115$v.tgz .); done
#   rm -rf .kcache; (cd /tmp/t_115d && KGEN_CACHE_DIR=/tmp/kc_d python -m bench.warm /work/main/.kcache --group sparse)
#   KGEN_CACHE_DIR=/tmp/kc_m python -m bench.warm .kcache --group sparse
# Carry .whl_kgen, .kcache, .ab (~36 MB). ~5 min; ROUNDS=1 (~2 min): one round of each, no --check, no suite.
# The kernel cache: steps.sh's KC (the carried .kcache) for every step and every tree.
set -u
rounds=${ROUNDS:-2}
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
for v in a b c d; do rm -rf "/tmp/t_115$v" && mkdir -p "/tmp/t_115$v" && tar xzf ".ab/v115$v.tgz" -C "/tmp/t_115$v"; done
# s57b: the batched rows alone at B8 (call ED measured B32 only): do 8-token tiles' rows pay there?
step gather_probe_b8 90 python3 -m bench.gather_probe --shape 8,131072,16 --modes 0 --ctas-per-sm 2 --out "$OUT/gprobe_b8"
for r in $(seq "$rounds"); do
    step "probe_main_r$r" 60 python3 -m bench.union_build_probe --templates "$root/templates" --out "$OUT/probe_main_r$r"
    for v in a b c d; do
        step "probe_v115${v}_r$r" 60 python3 -m bench.union_build_probe --templates "/tmp/t_115$v/templates" --out "$OUT/probe_v115${v}_r$r"
    done
done
# v115d against main, alternating (bench/gpu_ab.sh; every run --check'd first), then v115d's suite
shapes=(--shape 32,32768,16,0.7 --shape 8,131072,16,0.7 --shape 8,32768,16,0.5 --shape 64,8192,16,0.7
        --shape 1,131072,16,0.7)
AB_TREES=v115d AB_MODULE=bench.sparse AB_CACHE=$KC bash bench/gpu_ab.sh sparse_ab "$rounds" \
    --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" $([ "$rounds" = 1 ] || echo --check)
echo "sparse_ab: $(grep -c 'rc=0' "$OUT/sparse_ab.log") of $((2 * rounds)) runs rc=0" >> "$OUT/summary.log"
[ "$rounds" = 1 ] || (cd /tmp/t_115d && step suite_v115d 150 python3 -m pytest -q -x tests/test_sparse_gpu.py)
{ echo "== gather_probe_b8"; tail -n 12 "$OUT/gather_probe_b8.log" | cut -c1-160
  for f in "$OUT"/probe_*.log; do echo "== $f"; grep '"design": "split16"' "$f" | cut -c1-110; done
  cut -c1-120 "$OUT/sparse_ab.log"
  cat "$OUT/summary.log"; } > "$OUT/all.txt"
(cd "$OUT" && tar czf results.tgz gprobe_b8 gather_probe_b8.log probe_* && rm -rf gprobe_b8 gather_probe_b8.log probe_*)  # few files come back
cat "$OUT/all.txt"
