"""torch.ops.kgen.*: fake (meta) implementations on the CPU, and torch.library.opcheck on the GPU."""

from pathlib import Path

import pytest
import torch

import kgen
from kgen import library
from kgen.inputs import make_verify_inputs
from kgen.accuracy import assert_close_attention, tolerances

SPEC = kgen.load_spec(Path(__file__).resolve().parents[1] / "specs" / "glm5_sm120.yaml")


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_output_shapes():
    library.register_spec(SPEC)
    q, kv, idx = meta(16, 8, 576), meta(1000, 576), meta(2, dtype=torch.int32)
    mask = meta(16, 2, dtype=torch.int32)
    for o, lse in (torch.ops.kgen.verify_attention(q, kv, kv[:16], idx, idx, idx, idx[:1], mask, SPEC.name),
                   torch.ops.kgen.prefix_attention(q, kv, idx, idx, idx, idx[:1], SPEC.name),
                   torch.ops.kgen.tree_attention(q, kv[:16], idx, mask, SPEC.name)):
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((16, 8, 512), torch.bfloat16, (16, 8), torch.float32)
    o, lse = torch.ops.kgen.merge_states(meta(4, 8, 512), meta(4, 8, dtype=torch.float32),
                                         meta(4, 8, 512), meta(4, 8, dtype=torch.float32), SPEC.name)
    assert o.shape == (4, 8, 512) and lse.shape == (4, 8)


def test_unknown_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="spec_name: unknown kgen spec 'nope'"):
        torch.ops.kgen.tree_attention(meta(1, 8, 576), meta(1, 576), meta(2, dtype=torch.int32), None, "nope")


@pytest.mark.gpu
def test_custom_ops_pass_opcheck(module_for, cuda, seed):
    mod = module_for("glm5_sm120")
    g = torch.Generator(cuda).manual_seed(seed)
    ins = make_verify_inputs(mod.spec, [5, 16], [70, 300], generator=g, device=cuda)
    name = mod.spec.name
    torch.library.opcheck(torch.ops.kgen.verify_attention, (*ins.verify_args(), name))
    torch.library.opcheck(torch.ops.kgen.prefix_attention, (*ins.prefix_args(), name))
    torch.library.opcheck(torch.ops.kgen.tree_attention, (*ins.tree_args(), name))
    o, lse = torch.ops.kgen.verify_attention(*ins.verify_args(), name)
    assert_close_attention(o, lse, *ins.verify_ref(), **tolerances(mod.spec), what="torch.ops.kgen.verify_attention")
    torch.library.opcheck(torch.ops.kgen.merge_states, (o.float(), lse, o.float(), lse - 1, name))
    caches = torch.randn(3, 64, 576, generator=g, device=cuda).bfloat16()
    src = torch.tensor([1, 2, 3], device=cuda)
    torch.library.opcheck(torch.ops.kgen.defrag, ([caches], src, src.roll(1), True, name))


def test_the_ops_exist_after_import_kgen_without_jit():
    import subprocess
    import sys

    code = ("import torch, kgen; print(all(hasattr(torch.ops.kgen, n) for n in "
            "('verify_attention', 'prefix_attention', 'tree_attention', 'merge_states', 'defrag')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
