#!/usr/bin/env bash
# On the GPU machine (no network), from the repository root, with .whl_peers/ carried
# (bench/peer_wheels.sh fills it here; PEER_WHEELS=DIR if it lies elsewhere, e.g. a job folder's
# ../../.whl_peers): install FlashInfer and FlashMLA into /tmp/site, then run
# the benchmark against them (bench/peers.py: same inputs, same CUDA-graph timing) for the GPU's
# own plan and for the sm_120 plan, page size 1 (permuted slots) and 64: the quick grid plus
# issue 19's table (--shapes issue19). SGLang's Triton baseline runs at page size 1 only (it is
# the slowest call here by far). Results (JSON + PNG per run, one tarball) and the log go to $OUT.
#   bash bench/gpu_peers.sh            # ~6 min: GPU tests of the peers, then 4 runs of 15 shapes
#   bash bench/gpu_peers.sh --short    # ~2.5 min: the sparse peer's test, then 5 shapes without Triton
#                                      # for the GPU's own plan at page 64 and the sm_120 plan at page 1
# Every run times all peers the GPU can run (--peers all: FlashInfer fa3 and fa2, FlashMLA at page
# size 64); extra arguments after the flag go to every python -m bench.run (e.g. --peers auto).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/kgen_peers_out}"
RES=/tmp/kgen_peers_results
mkdir -p "$OUT" "$RES"
LOG="$OUT/gpu_peers.log"
SHORT=0
if [ "${1:-}" = "--short" ]; then SHORT=1; shift; fi

WHEELS="${PEER_WHEELS:-.whl_peers}"
ls "$WHEELS"/*.whl > /dev/null || { echo "no wheels in $WHEELS: run bench/peer_wheels.sh where pip has network" | tee "$LOG"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl 2>&1 | tee "$LOG" || exit 1
# keep what the caller put on PYTHONPATH (e.g. pydantic installed elsewhere)
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    KGEN_CACHE_DIR="${KGEN_CACHE_DIR:-/tmp/kgen_cache}" FLASHINFER_WORKSPACE_BASE=/tmp MAX_JOBS="${MAX_JOBS:-16}"
python3 -c "import importlib.metadata as m, torch; print(torch.cuda.get_device_name(), *(f'{d} {m.version(d)}' for d in
('torch', 'triton', 'flashinfer-python', 'apache-tvm-ffi', 'sgl-flash-mla')))" 2>&1 | tee -a "$LOG"
command -v nvcc >/dev/null && nvcc --version | tail -1 | tee -a "$LOG"

# the peers against the reference first (also builds FlashInfer's two MLA modules, cached for the runs;
# --short: the sparse peer alone, the bench checks the dense ones before timing them)
TESTS=(tests/test_peers_gpu.py)
[ "$SHORT" = 1 ] && TESTS+=(-k sparse)
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}" 2>&1 | tee -a "$LOG"

if [ "$SHORT" = 1 ]; then
    GRID=(--shapes 1x131072x16x8,8x32768x64x8,1x131072x1x8,16x32768x33x16,1x4096x16x8 --no-triton) LIMIT=70
else
    GRID=(--quick --shapes issue19) LIMIT=80
fi
bench() {  # plan (empty: the GPU's own), page size, extra args
    local plan=() triton=()
    [ -n "$1" ] && plan=(--plan-arch "$1")
    [ "$2" != 1 ] && triton=(--no-triton)
    echo "=== plan ${1:-own}, page size $2 ===" | tee -a "$LOG"
    # each run starts no new shape after LIMIT s and is killed at LIMIT + 40 s: 4 runs fit one 10-minute call
    # page size 64 on the shipped page-64 spec, whose tuned table then picks each H = 8 shape's tiling
    local spec=specs/glm5_sm120.yaml && [ "$2" = 64 ] && spec=specs/glm5_p64_sm120.yaml
    timeout $((LIMIT + 40)) python3 -m bench.run --spec "$spec" "${GRID[@]}" --page-size "$2" \
        "${plan[@]}" "${triton[@]}" --peers all --no-halves --time-limit "$LIMIT" --out "$RES" "${@:3}" 2>&1 \
        | tee -a "$LOG"
    tar -czf "$OUT/peers_results.tar.gz" -C "$RES" .  # after every run: a cut-short job keeps what it measured
}
if [ "$SHORT" = 1 ]; then
    bench "" 64 "$@"
    bench sm_120 1 "$@"
else
    bench "" 1 "$@"
    bench "" 64 "$@"
    bench sm_120 1 "$@"
    bench sm_120 64 "$@"
fi
ls -la "$RES" | tee -a "$LOG"
