"""SGLang's DSA KV pool rows on the GPU (DESIGN §11, cache.scales: per_block): kgen's quantizer
against SGLang's own pool writer running on CUDA, and the attention kernels on 656-byte rows where
the per-block scales matter. (tests/test_attention_gpu.py and tests/test_step_gpu.py run the DSA
specs through every random, edge, long-prefix, graph-replay and bad-input test; this file adds
what is particular to the format.)"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kgen import fp8
from kgen.accuracy import assert_close_attention, tolerances
from kgen.inputs import Dims, make_verify_inputs

from test_attention_gpu import check_ops, describe, generator

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.gpu

SPECS = ["glm5_dsa_fp8_sm120", "glm5_dsa_e4m3_sm120"]


def test_sglangs_pool_writer_on_cuda_stores_kgens_rows_byte_for_byte(cuda, seed):
    """SGLang's DSATokenToKVPool writer (its Triton quantizer and row scatter, compiled for this
    GPU: tests/sglang_dsa_writer.py, unpatched) against kgen.fp8.quantize_rows, on keys whose
    blocks span 1e-3 .. 1e3 (tests/test_fp8.py runs the same check in Triton's CPU interpreter)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (bench/gpu_dsapool.sh installs the carried wheels from .whl/)")
    from sglang_harness import stand_in_missing
    from sglang_dsa_writer import write_rows
    from test_fp8 import dsa_keys

    stand_in_missing()
    g = torch.Generator().manual_seed(seed)
    k = dsa_keys(4096, g).to(cuda)
    loc = (torch.randperm(8000, generator=g)[:4096] + 1).to(cuda)
    pool = write_rows(k, loc, 8001)
    mine = fp8.quantize_rows(k, 512)
    diff = (pool[loc, 0] != mine).nonzero()
    assert diff.numel() == 0, f"{len(diff)} bytes differ, first (row, byte) {diff[0].tolist()}"


@pytest.mark.parametrize("spec_name", SPECS)
def test_tree_keys_as_stored_rows_give_the_same_bits_as_bf16_keys(module_for, cuda, seed, spec_name):
    """k_tree in bf16 is quantized to pool rows by the op (fp8.quantize_rows); passing those rows
    (uint8 [T, 656]) instead must give bit-identical results."""
    mod = module_for(spec_name)
    inp = make_verify_inputs(Dims.of(mod.spec), [16, 5, 64], [3000, 0, 700], device=cuda,
                             generator=generator(cuda, seed))
    rows = replace(inp, k_tree=fp8.quantize_rows(inp.k_tree, 512))
    for op in ("verify_attention", "tree_attention"):
        args = (inp.verify_args if op == "verify_attention" else inp.tree_args)()
        args_rows = (rows.verify_args if op == "verify_attention" else rows.tree_args)()
        o, lse = getattr(mod, op)(*args)
        o2, lse2 = getattr(mod, op)(*args_rows)
        assert torch.equal(o, o2) and torch.equal(lse, lse2), f"{spec_name}: {op} differs with uint8 tree rows"
    assert_close_attention(*mod.verify_attention(*rows.verify_args()), *rows.verify_ref(), **tolerances(mod.spec),
                           what=f"{spec_name}: verify with uint8 tree rows")


@pytest.mark.parametrize("magnitudes", [(-3, 3), (-6, 6)], ids=["1e-3..1e3", "1e-6..1e6"])
def test_block_scales_far_apart_within_and_across_rows(module_for, cuda, seed, magnitudes):
    """Each latent block of each row (and its rope) at its own magnitude 10^u: the per-key scales
    enter Q·K after each group's latent steps and P·V through each group's own P, which must hold
    up at any spread (f16 mode: DESIGN §6 tolerances); a row whose block is all zero (scale 0) is
    fine too. The prefix is long enough that the P references grow after the first tiles."""
    spec_name = "glm5_dsa_fp8_sm120"
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    g = generator(cuda, seed)
    inp = make_verify_inputs(replace(dims, kv_dtype="bfloat16"), [16, 3], [20000, 333], device=cuda, generator=g)
    lo, hi = magnitudes

    def spread(k):
        m = 10.0 ** ((hi - lo) * torch.rand(k.shape[0], 5, generator=g, device=cuda) + lo)
        m = m / m.amax(1, keepdim=True).sqrt()  # keep |logits| moderate: peaky, not one-hot
        widths = torch.tensor([128] * 4 + [64], device=cuda)
        return (k.float() * torch.repeat_interleave(m, widths, dim=1)).bfloat16()

    cache = spread(inp.kv_cache)
    cache[7, 256:384] = 0  # one all-zero block: scale 0
    inp = replace(inp, kv_cache=cache, k_tree=spread(inp.k_tree)).stored_as(dims)
    check_ops(mod, inp, f"spread {magnitudes}: {describe(spec_name, inp, 'random')}")

