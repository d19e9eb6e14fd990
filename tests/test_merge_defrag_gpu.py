"""merge_states against the float64 reference and defrag bit-exact against defrag_ref, on the GPU
(DESIGN §5, §6)."""

from __future__ import annotations

import pytest
import torch

from kgen.reference import defrag_ref, merge_states_ref
from kgen.inputs import poison_
from kgen.accuracy import assert_all_written, assert_close_attention

pytestmark = pytest.mark.gpu


def generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device).manual_seed(seed)


# ---- merge_states ----------------------------------------------------------------------------

def random_state(rows, heads, width, dtype, g, blind):
    """A state whose lse spans a wide range; where `blind`, lse = -inf and o holds large garbage
    that the merge must ignore."""
    o = torch.randn(rows, heads, width, generator=g, device=blind.device).to(dtype)
    lse = torch.randn(rows, heads, generator=g, device=blind.device) * 20
    o[blind] = (1e3 * torch.randn(int(blind.sum()), width, generator=g, device=blind.device)).to(dtype)
    return o, lse.masked_fill(blind, float("-inf"))


@pytest.mark.parametrize("rows", [1, 37, 4096])
@pytest.mark.parametrize("spec_name", ["glm5_sm120", "glm5_tp4_sm120", "deepseek_v3_sm120"])
@pytest.mark.parametrize("dtype,o_tol,lse_tol", [(torch.float32, 1e-5, 1e-5), (torch.bfloat16, 1e-2, 1e-3)],
                         ids=["fp32", "bf16"])
def test_merge_states_matches_the_reference(module_for, cuda, seed, spec_name, rows, dtype, o_tol, lse_tol):
    mod = module_for(spec_name)
    heads, width = mod.spec.model.num_q_heads, mod.spec.model.value_dim
    g = generator(cuda, seed)
    blind_a = torch.rand(rows, heads, generator=g, device=cuda) < 0.2
    blind_b = torch.rand(rows, heads, generator=g, device=cuda) < 0.2
    blind_a[0, 0] = blind_b[0, 0] = True  # a row both states are blind in: o = 0, lse = -inf
    state_a = random_state(rows, heads, width, dtype, g, blind_a)
    state_b = random_state(rows, heads, width, dtype, g, blind_b)
    out = poison_(torch.empty_like(state_a[0]))
    lse = poison_(torch.empty_like(state_a[1]))
    got = mod.merge_states(*state_a, *state_b, out=out, lse=lse)
    assert got[0].data_ptr() == out.data_ptr() and got[1].data_ptr() == lse.data_ptr()
    assert_all_written(out, "merge_states out")
    assert_all_written(lse, "merge_states lse")
    assert_close_attention(out, lse, *merge_states_ref(*state_a, *state_b), o_tol=o_tol, lse_tol=lse_tol,
                           what=f"merge_states {dtype} rows={rows} heads={heads}")


# ---- defrag ----------------------------------------------------------------------------------

def moves(kind: str, n: int, slots: int, g, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) of n moves among `slots` rows; destinations are distinct and overlap sources."""
    perm = torch.randperm(slots, generator=g, device=g.device)
    if kind == "random":  # sources anywhere, repeats allowed
        src, dst = torch.randint(0, slots, (n,), generator=g, device=g.device), perm[:n]
    elif kind == "cycle":  # s0 -> s_{n-1}, s1 -> s0, ...: a rotation (n = 2: a swap)
        src, dst = perm[:n], perm[:n].roll(1)
    elif kind == "chain":  # s0 -> s1 -> ... -> s_n: every destination but the last is also read
        src, dst = perm[:n], perm[1:n + 1]
    elif kind == "compact":  # scattered rows to the front, as when a request is made contiguous
        src, dst = perm[:n], torch.arange(n, device=g.device)
    else:
        raise ValueError(kind)
    return src.to(dtype), dst.to(dtype)


def make_caches(form: str, layers: int, slots: int, width: int, g):
    if form == "stacked":
        return torch.randn(layers, slots, width, generator=g, device=g.device, dtype=torch.bfloat16)
    shape = (slots, 1, width) if form == "list_3d" else (slots, width)
    return [torch.randn(shape, generator=g, device=g.device, dtype=torch.bfloat16) for _ in range(layers)]


def assert_bit_exact(got, expected, what: str) -> None:
    got = got if isinstance(got, torch.Tensor) else torch.stack(got)
    expected = expected if isinstance(expected, torch.Tensor) else torch.stack(expected)
    diff = got.view(torch.int16) != expected.view(torch.int16)
    if diff.any():
        layer, slot = diff.reshape(got.shape[0], got.shape[1], -1).any(-1).nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int(diff.sum())} values differ from defrag_ref, first at layer {layer} "
                             f"slot {slot}")


@pytest.mark.parametrize("layers,n,form,kind,index_dtype", [
    (4, 0, "stacked", "random", torch.int32),
    (78, 1, "stacked", "random", torch.int32),
    (78, 2, "stacked", "cycle", torch.int64),
    (78, 1000, "stacked", "chain", torch.int32),
    (78, 4097, "stacked", "compact", torch.int64),
    (78, 65536, "stacked", "random", torch.int32),
    (78, 3, "list", "cycle", torch.int32),
    (78, 5000, "list", "random", torch.int64),
    (78, 65536, "list", "chain", torch.int32),
    (78, 100, "list_3d", "compact", torch.int32),
    (2, 1_000_000, "stacked", "random", torch.int32),
    (2, 1_000_000, "list", "cycle", torch.int64),
    (3, 1_000_000, "stacked", "chain", torch.int32),
])
def test_defrag_moves_rows_exactly(module_for, cuda, seed, layers, n, form, kind, index_dtype):
    mod = module_for("glm5_sm120")
    g = generator(cuda, seed)
    slots = max(64, 2 * n)
    caches = make_caches(form, layers, slots, mod.spec.model.head_dim, g)
    src, dst = moves(kind, n, slots, g, index_dtype)
    expected = defrag_ref(caches, src, dst)
    mod.defrag(caches, src, dst)
    assert_bit_exact(caches, expected, f"defrag {form} layers={layers} moves={n} {kind}")


@pytest.mark.parametrize("form", ["stacked", "list"])
def test_defrag_in_a_cuda_graph_replays_with_new_moves(module_for, cuda, seed, form):
    mod = module_for("glm5_sm120")
    g = generator(cuda, seed)
    slots, n = 8192, 3000
    caches = make_caches(form, 78, slots, mod.spec.model.head_dim, g)
    src, dst = moves("random", n, slots, g, torch.int32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (a list's layer table is uploaded on first use)
        mod.defrag(caches, src, dst)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.defrag(caches, src, dst)
    for replay, kind in enumerate(["cycle", "chain", "random", "compact"]):
        new_src, new_dst = moves(kind, n, slots, g, torch.int32)
        src.copy_(new_src)
        dst.copy_(new_dst)
        expected = defrag_ref(caches, src, dst)
        graph.replay()
        assert_bit_exact(caches, expected, f"defrag graph replay {replay} ({kind}) {form}")


# ---- bad input -------------------------------------------------------------------------------

def merge_call(cuda, g):
    state = [torch.randn(6, 8, 512, generator=g, device=cuda), torch.randn(6, 8, generator=g, device=cuda)]
    return {"o_a": state[0], "lse_a": state[1], "o_b": state[0].clone(), "lse_b": state[1].clone()}


@pytest.mark.parametrize("arg,breaks", [
    ("o_a", lambda a: {"o_a": a["o_a"].cpu()}),
    ("o_a", lambda a: {"o_a": a["o_a"].half(), "o_b": a["o_b"].half()}),
    ("o_b", lambda a: {"o_b": a["o_b"].bfloat16()}),
    ("o_b", lambda a: {"o_b": a["o_b"][:5].contiguous()}),
    ("lse_a", lambda a: {"lse_a": a["lse_a"][:, :7].contiguous()}),
    ("lse_b", lambda a: {"lse_b": a["lse_b"].double()}),
    ("out", lambda a: {"out": torch.empty_like(a["o_a"], dtype=torch.bfloat16)}),
    ("lse", lambda a: {"lse": torch.empty_like(a["o_a"])}),
], ids=["o_a_on_cpu", "float16", "mixed_dtypes", "o_b_rows", "lse_a_heads", "lse_b_float64", "out_dtype",
        "lse_shape"])
def test_merge_states_bad_input_names_the_argument(module_for, cuda, seed, arg, breaks):
    kwargs = merge_call(cuda, generator(cuda, seed))
    kwargs.update(breaks(kwargs))
    with pytest.raises((ValueError, TypeError), match=rf"\b{arg}\b"):
        module_for("glm5_sm120").merge_states(**kwargs)


@pytest.mark.parametrize("arg,breaks", [
    ("src", lambda c, s, d: (c, s[:-1], d)),
    ("src", lambda c, s, d: (c, s.float(), d)),
    ("dst", lambda c, s, d: (c, s, d.view(2, -1))),
    ("kv_caches", lambda c, s, d: ({"layer0": c[0]}, s, d)),
    ("kv_caches", lambda c, s, d: ([c[0], c[1][:-1]], s, d)),
    ("kv_caches", lambda c, s, d: ([c[0], c[1].cpu()], s, d)),
], ids=["lengths_differ", "src_float", "dst_rank_2", "dict_of_layers", "layer_sizes_differ", "layer_on_cpu"])
def test_defrag_bad_input_names_the_argument(module_for, cuda, seed, arg, breaks):
    g = generator(cuda, seed)
    caches = make_caches("list", 2, 64, 576, g)
    src, dst = moves("random", 8, 64, g, torch.int32)
    with pytest.raises((ValueError, TypeError), match=rf"\b{arg}"):
        module_for("glm5_sm120").defrag(*breaks(caches, src, dst))


@pytest.mark.parametrize("arg,breaks", [
    ("dst", lambda s, d: (s, d.index_fill(0, torch.tensor([1], device=d.device), int(d[0])))),
    ("src", lambda s, d: (s.index_fill(0, torch.tensor([0], device=s.device), 64), d)),
    ("dst", lambda s, d: (s, d.index_fill(0, torch.tensor([0], device=d.device), -1))),
], ids=["dst_repeats", "src_past_end", "dst_negative"])
def test_defrag_validate_mode_checks_moves(module_for, cuda, seed, monkeypatch, arg, breaks):
    monkeypatch.setenv("KGEN_VALIDATE", "1")
    g = generator(cuda, seed)
    caches = make_caches("stacked", 2, 64, 576, g)
    src, dst = breaks(*moves("random", 8, 64, g, torch.int32))
    with pytest.raises(ValueError, match=rf"\b{arg}\b"):
        module_for("glm5_sm120").defrag(caches, src, dst)
        torch.cuda.synchronize()
