#!/usr/bin/env bash
# Here (a machine with pip and network): fetch into .whl/ (git-ignored) what bench/gpu_sglang.sh
# installs on the GPU machine (Python 3.12, no network): the real sglang 0.5.23 and the
# pure-Python packages its attention backends, registry and config import. The sglang wheel is
# carried without its Rust extension modules (*.so, 19 MB: its HTTP server, gRPC, bench and radix
# tree; nothing the attention path imports) to stay small; its Python files are untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
get() {
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$@"
}
get --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 gguf
get pydantic msgspec orjson pyzmq pybase64 starlette loguru dill partial-json-parser openai==2.8.0 ipython
python3 - <<'PY'
import glob, os, zipfile
src = glob.glob(".whl/sglang-*.whl")[0]
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not item.filename.endswith(".so"):
            zout.writestr(item, zin.read(item.filename))
os.replace(tmp, src)
PY
du -sh .whl && ls .whl
