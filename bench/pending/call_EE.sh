# Call EE (fifty-sixth session): where the key-list build's time goes (s56a measured ~13 cycles a
# CTA per inserted entry): ncu's SASS samples of bench.union_build_probe's split16 at B32 (every entry
# inserted) and whole64 at B8; then three more rounds of v113 against main at B1 T16 and T1.
# Carry .whl_kgen, .kcache, .ab.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
prof() {  # design, shape
    step "ncu_$1" 120 ncu --clock-control none -k regex:union_build --launch-skip 2 -c 1 --section SourceCounters \
        --section WarpStateStats -f -o "/tmp/ub_$1" python3 -m bench.union_build_probe --profile "$1" --shape "$2"
    ncu --import "/tmp/ub_$1.ncu-rep" --page source --print-source sass --csv 2>/dev/null | gzip > "$OUT/ncu-ub-$1.csv.gz"
    ncu --import "/tmp/ub_$1.ncu-rep" --page details > "$OUT/ncu-ub-$1-details.txt" 2>&1
    PYTHONPATH=$PWD python3 -m bench.sass_samples "$OUT/ncu-ub-$1.csv.gz" --top 25 > "$OUT/samples-$1.txt" 2>&1
}
prof split16 32,32768,16
prof whole64 8,131072,16
rm -rf /tmp/t_main && mkdir -p /tmp/t_main && tar xzf .ab/main.tgz -C /tmp/t_main
shapes=(--shape 1,131072,16,0.7 --shape 1,131072,1,0.7)
ab() { local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 60 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "/tmp/$name" "$@"); }
for r in 3 4 5; do ab "main_r$r" /tmp/t_main; ab "v113_r$r" "$root"; done
for f in "$OUT"/main_r*.log "$OUT"/v113_r*.log; do echo "== $f"; tail -n 3 "$f"; done > "$OUT/tables.log"
cat "$OUT/tables.log" "$OUT/samples-split16.txt" "$OUT/summary.log"
