# Sourced by the pending call scripts on the GPU machine (repository root): pydantic's wheels
# (.whl_kgen, carried) into /tmp/site, and `step NAME SECONDS COMMAND...`, which runs COMMAND under a
# time limit into $OUT/NAME.log and adds a line to $OUT/summary.log. KC: the kernel cache (default
# /tmp/kc; a carried .kcache from python -m bench.warm compiles nothing).
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_kgen/*.whl
step() { local name=$1 limit=$2 s=$SECONDS; shift 2
  env PYTHONPATH=/tmp/site:$PWD KGEN_CACHE_DIR="${KC:-/tmp/kc}" timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.log"; }
