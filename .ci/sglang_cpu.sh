#!/usr/bin/env bash
# What the SGLang tests need on a CPU-only machine (CI runs this; so can a user, from the
# repository root: `bash .ci/sglang_cpu.sh`). The real SGLang without its GPU stack (sglang pins
# torch 2.14.1 and CUDA wheels): what importing its attention backends, registry, CLI and model
# runner needs; and each supported release's wheel, for the adapter check
# (tests/test_sglang_compat.py reads the wheels, never installs them), into
# $KGEN_SGLANG_WHEELS (default .sglang_wheels/, where the test looks without the variable).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q --no-deps sglang==0.5.23
pip install -q triton==3.8.0 psutil pybase64 pyzmq msgspec starlette tqdm aiohttp orjson pillow IPython \
    transformers==5.19.0 dill sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 loguru \
    gguf openai==2.8.0 partial-json-parser einops uvicorn fastapi
wheels="${KGEN_SGLANG_WHEELS:-.sglang_wheels}"
for v in 0.5.21 0.5.22 0.5.23; do
    pip download -q --no-deps "sglang==$v" -d "$wheels"
done
