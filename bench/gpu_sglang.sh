#!/usr/bin/env bash
# On the GPU machine (no network), from the repository root, with .whl/ carried (bench/gpu_wheels.sh
# fills it here): install the carried wheels of packages the machine lacks into /tmp/site, then run
# the SGLang GPU tests — the real KgenAttnBackend against SGLang's TritonAttnBackend
# (tests/test_sglang_backend_gpu.py; GLM-5's DSA pool: tests/test_sglang_glm5_gpu.py) and kgen's
# SGLang path against SGLang's Triton kernels
# (tests/test_sglang_gpu.py). Extra arguments go to pytest (e.g. -k graph). Logs to $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 - > /tmp/kgen_wheels.txt <<'PY'
import glob, importlib.metadata as md, re
for wheel in sorted(glob.glob(".whl/*.whl")):
    dist = re.sub(r"[-_.]+", "-", wheel.split("/")[-1].split("-")[0]).lower()
    try:
        md.version(dist)  # already on this machine: keep its own
    except md.PackageNotFoundError:
        print(wheel)
PY
echo "installing: $(xargs -n1 basename < /tmp/kgen_wheels.txt | tr '\n' ' ')"
if [ -s /tmp/kgen_wheels.txt ]; then  # nothing to install when the machine has every carried package
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        $(cat /tmp/kgen_wheels.txt) || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 KGEN_CACHE_DIR="${KGEN_CACHE_DIR:-/tmp/kgen_cache}"
python3 -c "import importlib.metadata as m, torch; print(torch.cuda.get_device_name(), *(f'{d} {m.version(d)}' for d in
('torch', 'triton', 'transformers', 'torchvision', 'sglang')))"
timeout 570 python3 -m pytest -q -p no:cacheprovider -rs tests/test_sglang_backend_gpu.py tests/test_sglang_glm5_gpu.py \
    tests/test_sglang_gpu.py \
    -s "$@" 2>&1 | tee "${OUT:-/tmp}/sglang_gpu.log"
