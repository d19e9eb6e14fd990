#!/usr/bin/env bash
# An A/B of one change on one GPU machine (machine-to-machine spread is 2-4%: bench/NOTES.md v39):
# bench.run of this tree and of a base tree, alternating, same shapes and options. Here, first:
#   mkdir -p .ab && git archive BASE kgen templates bench specs pyproject.toml ":!bench/results" | gzip > .ab/base.tgz
# (.ab/ and .whl_kgen/ — pydantic's wheels, which the GPU image lacks — git-ignored, carried). On the
# GPU machine: `bash bench/gpu_ab.sh NAME ROUNDS BENCH_ARGS...`; $OUT gets NAME.log (each run's table) and
# NAME.tgz (each run's log and JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}" name=$1 rounds=$2
shift 2
[ -d .whl_kgen ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl_kgen/*.whl
runs=/tmp/$name
rm -rf /tmp/ab_base "$runs" && mkdir -p /tmp/ab_base "$runs" && tar xzf .ab/base.tgz -C /tmp/ab_base
for round in $(seq "$rounds"); do
    for tree in change base; do
        dir=$PWD && [ $tree = base ] && dir=/tmp/ab_base
        (cd "$dir" && KGEN_CACHE_DIR=/tmp/ab_cache_$tree PYTHONPATH="/tmp/site:$dir" PYTHONUNBUFFERED=1 \
            timeout 280 python3 -m bench.run --no-triton --peers none --out "$runs/$tree$round" "$@") \
            > "$runs/$tree$round.log" 2>&1
        echo "== $tree, round $round: rc=$?" >> "$out/$name.log"
        tail -25 "$runs/$tree$round.log" >> "$out/$name.log"
    done
done
tar czf "$out/$name.tgz" -C /tmp "$name"
