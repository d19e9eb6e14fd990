# Call EC (prepared in the fifty-fifth session): v113 (bench/pending/v113-sparse-combine-5-states-a-group.patch,
# branch v113-combine-batch5) against main, bench.sparse on five shapes, two rounds alternating (v113's
# first with --check), then the sparse GPU suite on v113. Before the call, here:
#   git archive HEAD kgen templates bench specs tests pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   git stash -u; git apply bench/pending/v113-sparse-combine-5-states-a-group.patch  (or check out the branch)
#   KGEN_CACHE_DIR=/tmp/kc_v113 python -m bench.warm .kcache --group sparse   (both trees: main's too)
# Carry .whl_kgen, .kcache, .ab. ~4 min.
set -u
source bench/pending/steps.sh
root=$PWD
export KC=$root/.kcache
rm -rf /tmp/t_main && mkdir -p /tmp/t_main && tar xzf .ab/main.tgz -C /tmp/t_main
shapes=(--shape 1,131072,16,0.7 --shape 1,131072,1,0.7 --shape 1,131072,64,0.5 --shape 8,131072,16,0.7
        --shape 32,32768,16,0.7)
ab() {  # name, tree, bench.sparse arguments
    local name=$1 dir=$2; shift 2
    (cd "$dir" && step "$name" 100 python3 -m bench.sparse --spec specs/glm5_dsa_sm120.yaml "${shapes[@]}" --out "/tmp/$name" "$@")
}
ab v113_r1 "$root" --check
ab main_r1 /tmp/t_main
ab main_r2 /tmp/t_main
ab v113_r2 "$root"
for f in "$OUT"/main_r*.log "$OUT"/v113_r*.log; do echo "== $f"; tail -n 8 "$f"; done > "$OUT/tables.log"
step suite 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py
cat "$OUT/summary.log"
