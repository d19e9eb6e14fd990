#!/usr/bin/env bash
# Here (a machine with pip and network): fetch into .whl_peers/ (git-ignored) the wheels of the
# benchmark's peers (bench/peers.py) that bench/gpu_peers.sh installs on the GPU machine
# (Python 3.12, x86_64, no network): flashinfer-python 0.7.0.post1 (pure Python; its JIT builds
# the MLA kernels with the machine's nvcc) and apache-tvm-ffi 0.1.15.post2 (its FFI), and
# sgl-flash-mla 1.0.0 (FlashMLA, prebuilt for torch's stable ABI). Of their requirements the GPU
# image already has torch, numpy, ninja, click, einops, requests, tabulate, tqdm, packaging,
# nvidia-ml-py and cuda-bindings; the rest (cuda-tile, nccl4py, nvidia-cutlass-dsl, ...) serve
# FlashInfer kernels the benchmark never imports. About 47 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl_peers && mkdir -p .whl_peers
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl_peers \
    flashinfer-python==0.7.0.post1 apache-tvm-ffi==0.1.15.post2 sgl-flash-mla==1.0.0
du -sh .whl_peers && ls .whl_peers
