# Call EG (prepared in the fifty-sixth session): v114b (bench/pending/v114b-bulk-insert.patch, branch
# v114-bulk-insert: the bulk rounds with plain, batched shared loads, where v114's volatile ones
# serialized them; skipped where few entries pass) against main: bench.union_build_probe over both
# trees' templates, then bench.sparse at three shapes, one round each (v114b with --check). Before the
# call, here: git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip
# > .ab/main.tgz; git apply bench/pending/v114b-bulk-insert.patch; warm .kcache in both trees
# (python -m bench.warm .kcache --group sparse, main's from the extracted archive). Carry .whl_kgen,
# .kcache, .ab. ~3 min. If it wins: two more rounds, the sm_120 plan, the sparse GPU suite.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
rm -rf /tmp/t_main && mkdir -p /tmp/t_main && tar xzf .ab/main.tgz -C /tmp/t_main
step probe_v114b 60 python3 -m bench.union_build_probe --out "$OUT"
step probe_main 60 python3 -m bench.union_build_probe --templates /tmp/t_main/templates --out "$OUT"
shapes=(--shape 1,131072,16,0.7 --shape 8,131072,16,0.7 --shape 32,32768,16,0.7)
(step v114b 150 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "$OUT/v114b" --check)
(cd /tmp/t_main && step main 150 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "$OUT/main")
grep -h '"design"' "$OUT"/probe_*.log | cut -c1-120
tail -n 5 "$OUT/v114b.log" "$OUT/main.log" | cut -c1-120; cat "$OUT/summary.log"
