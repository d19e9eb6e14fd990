"""fp8 helpers on the CPU: the e4m3 rounding of Q that the e4m3 MMA mode applies, and the error
script's emulation of both modes (bench/fp8_error.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

import kgen
from kgen import fp8, reference
from kgen.inputs import make_verify_inputs
from kgen.spec import parse_spec

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


# ---- the DSA pool's scaled rows (cache.scales: per_block) -------------------------------------

def dsa_keys(n: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 keys [n, 576]: each 128-dim latent block, and the rope, at its own magnitude in 1e-3 .. 1e3."""
    magnitude = 10.0 ** (6 * torch.rand(n, 5, 1, generator=generator) - 3)
    lat = torch.randn(n, 4, 128, generator=generator) * magnitude[:, :4]
    rope = torch.randn(n, 64, generator=generator) * magnitude[:, 4]
    return torch.cat([lat.reshape(n, 512), rope], dim=1).bfloat16()


def test_sglangs_dsa_pool_writer_stores_kgens_rows_byte_for_byte(tmp_path, seed):
    """SGLang's own writer (DSATokenToKVPool's _write_mla_kv_buffer: its Triton quantizer and row
    scatter, in Triton's CPU interpreter; tests/sglang_dsa_writer.py) against kgen.fp8.quantize_rows."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (CI installs it: .ci/run)")
    g = torch.Generator().manual_seed(seed)
    k = dsa_keys(96, g)
    loc = torch.randperm(200, generator=g)[:96] + 1  # slot 0 is SGLang's padding slot: its writer skips it
    torch.save({"k": k, "loc": loc, "num_slots": 201}, tmp_path / "in.pt")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sglang_dsa_writer.py"), str(tmp_path / "in.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pool = torch.load(tmp_path / "out.pt")
    assert pool.shape == (201, 1, 656) and pool.dtype == torch.uint8
    mine = fp8.quantize_rows(k, 512)
    assert mine.shape == (96, 656)
    rows = pool[loc, 0]
    diff = (rows != mine).nonzero()
    assert diff.numel() == 0, f"{len(diff)} bytes differ, first (row, byte) {diff[0].tolist()}"
    untouched = torch.ones(201, dtype=torch.bool)
    untouched[loc] = False
    assert (pool[untouched] == 0).all()


def test_scaled_rows_lay_out_latent_scales_rope_and_dequantize_within_e4m3_rounding(seed):
    g = torch.Generator().manual_seed(seed)
    k = dsa_keys(64, g)
    k[5, 128:256] = 0  # an all-zero block: scale 0, bytes 0
    rows = fp8.quantize_rows(k[:, None, :], 512)  # [N, 1, D] is taken too
    x = k.double()
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    amax = x[:, :512].reshape(64, 4, 128).abs().amax(-1)
    assert torch.equal(scales, (amax.float() / 448))  # scale k = max |dims 128k .. 128k+127| / 448
    assert torch.equal(rows[:, 528:].contiguous().view(torch.bfloat16), k[:, 512:])  # rope: the bf16 values
    assert (rows[5, 128:256] == 0).all() and scales[5, 1] == 0
    deq = reference.dequantize_scaled_rows(rows, 512)
    assert deq.shape == (64, 576) and torch.equal(deq[:, 512:], x[:, 512:])
    err = (deq[:, :512] - x[:, :512]).abs().reshape(64, 4, 128)
    # e4m3 keeps 3 mantissa bits: error <= 2^-4 relative for normals, <= 2^-10 * scale below them
    bound = torch.maximum(x[:, :512].abs().reshape(64, 4, 128) * 2.0 ** -4, scales[..., None].double() * 2.0 ** -10)
    assert (err <= bound * (1 + 1e-6)).all()
    assert (deq[:, :512].reshape(64, 4, 128).abs().amax(-1) - amax).abs().max() <= amax.max() * 1e-6  # max exact


def test_scaled_row_nan_poison_survives_quantization():
    k = torch.full((2, 576), float("nan"), dtype=torch.bfloat16)
    deq = reference.dequantize_scaled_rows(fp8.quantize_rows(k, 512), 512)
    assert torch.isnan(deq).all()  # unused slots of test pools hold NaN: reading one must show


def test_reference_reads_pool_rows_as_their_dequantized_values(seed):
    """verify_ref on uint8 DSA rows (cache and tree keys) equals verify_ref on their float64
    dequantization: the reference the kernels are compared with on such caches."""
    spec = parse_spec({**yaml.safe_load((ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml").read_text()),
                            "name": "dsa"})
    inp = make_verify_inputs(spec, [8, 3], [500, 64], generator=torch.Generator().manual_seed(seed))
    assert inp.kv_scaled and inp.kv_cache.shape[1] == 656
    tree_rows = fp8.quantize_rows(inp.k_tree, 512)
    deq = replace(inp, kv_cache=reference.dequantize_scaled_rows(inp.kv_cache, 512),
                  k_tree=reference.dequantize_scaled_rows(tree_rows, 512))
    for a, b in zip(inp.verify_ref(), deq.verify_ref()):
        assert torch.isfinite(a).any() and torch.equal(a, b)
    # the rows' scales differ within and across rows (testing.block_magnitudes)
    used = inp.kv_cache[torch.isfinite(reference.dequantize_scaled_rows(inp.kv_cache, 512)).all(1)]
    scales = used[:, 512:528].contiguous().view(torch.float32)
    assert (scales.amax(1) / scales.amin(1)).max() > 2 and (scales[:, 0].amax() / scales[:, 0].amin()) > 2


def test_scaled_rows_of_no_tokens():
    """A request with no prefix (L = 0) or no tree tokens: zero rows both ways."""
    rows = fp8.quantize_rows(torch.empty(0, 1, 576, dtype=torch.bfloat16), 512)
    assert rows.shape == (0, 656) and reference.dequantize_scaled_rows(rows, 512).shape == (0, 576)
    spec = parse_spec({**yaml.safe_load((ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml").read_text()), "name": "dsa"})
    inp = make_verify_inputs(spec, [3, 0, 2], [0, 40, 0], generator=torch.Generator().manual_seed(0))
    o, lse = inp.verify_ref()
    assert torch.isfinite(lse).all() and o.shape == (5, 8, 512)
