"""fp8 helpers on the CPU: the e4m3 rounding of Q that the e4m3 MMA mode applies, and the error
script's emulation of both modes (bench/fp8_error.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import kgen
from kgen import fp8
from kgen.inputs import make_verify_inputs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1000.0, 1e30])
def test_e4m3_rows_scale_each_row_so_nothing_saturates(scale, seed):
    q = (torch.randn(64, 8, 576, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()
    q[3, 2] = 0  # an all-zero row stays zero
    r = fp8.e4m3_rows(q)
    assert torch.isfinite(r).all() and (r[3, 2] == 0).all()
    x = q.float()
    amax = x.abs().amax(-1)
    assert torch.allclose(r.abs().amax(-1), amax, rtol=1e-6)  # each row's max is 448 * its scale: exact
    small = x.abs() >= amax.unsqueeze(-1) * 2.0 ** -6  # e4m3 normals: 3 mantissa bits, error <= 2^-4
    assert ((r - x).abs()[small] <= x.abs()[small] * 2.0 ** -4 * (1 + 1e-6)).all()


def test_emulated_modes_f16_exact_e4m3_rounded(seed):
    from bench.fp8_error import emulated, rel_l2

    g = torch.Generator().manual_seed(seed)
    x = make_verify_inputs(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"), [5, 16], [300, 77], generator=g)
    x = replace(x, q=(x.q.float() * 4).bfloat16()).to_fp8(0.01)
    ref_o, ref_lse = x.verify_ref()
    o16, lse16 = emulated("f16", x, tree_only=False)
    o8, lse8 = emulated("e4m3", x, tree_only=False)
    assert rel_l2(o16, ref_o) < 1e-3 and torch.allclose(lse16, ref_lse)
    assert 1e-2 < rel_l2(o8, ref_o) < 0.3
