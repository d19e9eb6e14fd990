"""The benchmark's peers on the GPU (bench/peers.py): each computes what the reference says for a
chain tree and for decode rows, and FlashMLA's sparse decode what its dequantized rows say.
Skipped with the reason where a peer cannot run (package not installed, another arch, page size):
bench/gpu_peers.sh installs the wheels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import kgen
from bench import peers
from bench import run as bench_run

pytestmark = pytest.mark.gpu
GLM5 = Path(__file__).resolve().parents[1] / "specs" / "glm5_sm120.yaml"
PLAN_ARCH = os.environ.get("KGEN_TEST_PLAN_ARCH") or None  # as tests/conftest.py: another arch's plan


@pytest.mark.parametrize("peer, page", [("flashinfer_fa3", 1), ("flashinfer_fa3", 64), ("flashinfer_fa2", 1),
                                        ("flashinfer_fa2", 64), ("flashmla", 64)])
def test_dense_peer_matches_the_reference(cuda, peer, page):
    spec = bench_run.spec_for(kgen.load_spec(GLM5), 8, 16, page)
    reason = peers.unavailable(peer, spec, page, torch.cuda.get_device_capability(cuda)[0])
    if reason:
        pytest.skip(reason)
    check = bench_run.peer_check(kgen.jit(spec, arch=PLAN_ARCH), [peer], spec, page, cuda, peers.workspace_for(cuda))
    got = check["peers"][peer]
    assert got["ok"], got
    assert check["kgen_vs_ref"] <= 1e-2


def test_flashmla_sparse_decode_matches_its_dequantized_rows(cuda):
    reason = peers.unavailable("flashmla", kgen.load_spec(GLM5), peers.DSA_PAGE,
                               torch.cuda.get_device_capability(cuda)[0])
    if reason:
        pytest.skip(reason)
    got = peers.sparse_check(cuda)
    assert got["rel_l2"] <= 1e-2 and got["worst_row"] <= 5e-2, got
