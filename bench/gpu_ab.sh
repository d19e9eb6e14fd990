#!/usr/bin/env bash
# An A/B of one change on one GPU machine (machine-to-machine spread is 2-4%: bench/NOTES.md v39):
# a benchmark of this tree and of archived trees, alternating, same shapes and options. Here, first:
#   mkdir -p .ab && git archive BASE kgen templates bench specs pyproject.toml ":!bench/results" | gzip > .ab/base.tgz
# (.ab/ and .whl_kgen/ — pydantic's wheels, which the GPU image lacks — git-ignored, carried). On the
# GPU machine: `bash bench/gpu_ab.sh NAME ROUNDS BENCH_ARGS...`; $OUT gets NAME.log (each run's table) and
# NAME.tgz (each run's log and JSON).
#   AB_TREES="base l16"   the archives .ab/base.tgz, .ab/l16.tgz (default: base) beside this tree ("change")
#   AB_MODULE=bench.sparse   the benchmark (default bench.run, run with --no-triton --peers none)
#   AB_CHANGE=               this tree is not run (the archives only)
#   AB_CACHE=DIR             one kernel cache for every tree (a carried .kcache that bench.warm filled in
#                            each tree: content-addressed, so their kernels sit side by side; default: a
#                            fresh cache a tree, compiled on the machine)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}" name=$1 rounds=$2
shift 2
module="${AB_MODULE:-bench.run}"
extra=() && [ "$module" = bench.run ] && extra=(--no-triton --peers none)
[ -d .whl_kgen ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl_kgen/*.whl
runs=/tmp/$name
rm -rf "$runs" && mkdir -p "$runs"
for tree in ${AB_TREES:-base}; do
    rm -rf "/tmp/ab_$tree" && mkdir -p "/tmp/ab_$tree" && tar xzf ".ab/$tree.tgz" -C "/tmp/ab_$tree"
done
for round in $(seq "$rounds"); do
    for tree in ${AB_CHANGE-change} ${AB_TREES:-base}; do
        dir=$PWD && [ $tree != change ] && dir=/tmp/ab_$tree
        (cd "$dir" && KGEN_CACHE_DIR="${AB_CACHE:-/tmp/ab_cache_$tree}" PYTHONPATH="/tmp/site:$dir" PYTHONUNBUFFERED=1 \
            timeout 280 python3 -m "$module" "${extra[@]}" --out "$runs/$tree$round" "$@") \
            > "$runs/$tree$round.log" 2>&1
        echo "== $tree, round $round: rc=$?" >> "$out/$name.log"
        tail -25 "$runs/$tree$round.log" >> "$out/$name.log"
    done
done
tar czf "$out/$name.tgz" -C /tmp "$name"
