"""verify_attention, prefix_attention and tree_attention on the GPU against the float64 reference
(DESIGN §5, §6): fresh random batches every run, outputs poisoned and passed as out=/lse=; the
same batches through a prepared step (tests/test_step_gpu.py has its graph and launch tests)."""

from __future__ import annotations

import math
import os
import random
from dataclasses import replace

import pytest
import torch
from conftest import spec_named
from schedule_rule import schedule_items

import kgen
from kgen import designs
from kgen.inputs import TREE_KINDS, Dims, make_verify_inputs, poison_
from kgen.accuracy import assert_all_written, assert_close_attention, tolerances

pytestmark = pytest.mark.gpu

# Random batches per spec: heads 8 / 16 / 128, page sizes 1 / 16 / 64, dynamic trees up to 64 /
# 1024 / 16 nodes, and the static 5-node tree.
# fp8 e4m3 KV: glm5_fp8_sm120 (f16 MMAs, page size 1), glm5_fp8_p64_sm120 (page size 64) and
# glm5_fp8_mma_e4m3_sm120 (e4m3 MMAs). SGLang's DSA pool (page size 64): glm5_p64_sm120 (bf16 rows),
# glm5_dsa_fp8_sm120 (656-byte fp8 rows with per-block scales, f16 MMAs), glm5_dsa_e4m3_sm120 (e4m3 MMAs).
RANDOM_CASES = {"glm5_sm120": 60, "glm5_tp4_sm120": 40, "deepseek_v3_sm120": 40, "glm5_p16_sm120": 40,
                "glm5_static5_sm120": 20, "glm5_fp8_sm120": 30, "glm5_fp8_p64_sm120": 20,
                "glm5_fp8_mma_e4m3_sm120": 20, "glm5_p64_sm120": 20, "glm5_dsa_fp8_sm120": 30,
                "glm5_dsa_e4m3_sm120": 15}
DYNAMIC_SPECS = ["glm5_sm120", "glm5_tp4_sm120", "deepseek_v3_sm120", "glm5_p16_sm120", "glm5_fp8_sm120",
                 "glm5_fp8_mma_e4m3_sm120", "glm5_p64_sm120", "glm5_dsa_fp8_sm120", "glm5_dsa_e4m3_sm120"]
MAX_ROWS = 1 << 17  # sum T * H of one random batch
MAX_LOGITS = 1 << 28  # sum over requests of T * H * (L + T): keeps the float64 reference quick


def generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device).manual_seed(seed)


def random_batch(dims: Dims, rng: random.Random) -> tuple[list[int], list[int], str]:
    """Tree sizes, prefix lengths and a tree kind: B from 1 to 64, T from 0 to max_nodes (with 1
    and max_nodes often), L from 0 to ~40k (tile edges, odd lengths, empty prefixes)."""
    batch = rng.choice([1, 1, 2, 3, 5, 8, 16, 33, 64])
    n = dims.max_nodes
    if dims.parents is not None:
        sizes = [n] * batch
    else:
        sizes = [rng.choice([1, n, rng.randint(1, n), rng.randint(0, min(n, 16))]) for _ in range(batch)]
        sizes[0] = sizes[0] or 1
        while sum(sizes) * dims.num_heads > MAX_ROWS:
            sizes = [max(1, t // 2) for t in sizes]
    lens = [rng.choice([0, rng.randint(1, 64), rng.randint(1, 2048), rng.randint(2048, 40000)]) for _ in sizes]
    while any(lens) and sum(t * dims.num_heads * (length + t) for t, length in zip(sizes, lens)) > MAX_LOGITS:
        lens[lens.index(max(lens))] //= 2
    return sizes, lens, rng.choice(TREE_KINDS)


def check_ops(mod, inp, what: str) -> None:
    """Each op into poisoned out=/lse= vs the reference, and merge(prefix, tree) vs verify."""
    results = {}
    for op, args, ref in (("verify_attention", inp.verify_args(), inp.verify_ref),
                          ("prefix_attention", inp.prefix_args(), inp.prefix_ref),
                          ("tree_attention", inp.tree_args(), inp.tree_ref)):
        out, lse = inp.outputs()
        got = getattr(mod, op)(*args, **inp.kv_kwargs, out=out, lse=lse)
        assert got[0].data_ptr() == out.data_ptr() and got[1].data_ptr() == lse.data_ptr(), \
            f"{what}: {op} did not return the out=/lse= tensors it was given"
        assert_all_written(out, f"{what}: {op} out")
        assert_all_written(lse, f"{what}: {op} lse")
        expected = ref()
        assert_close_attention(out, lse, *expected, **tolerances(mod.spec), what=f"{what}: {op}")
        results[op] = out, lse, expected
    merged = mod.merge_states(*results["prefix_attention"][:2], *results["tree_attention"][:2])
    assert_close_attention(*merged, *results["verify_attention"][2], **tolerances(mod.spec),
                           what=f"{what}: merge_states(prefix, tree)")
    check_prepared(mod, inp, results, what)


def check_prepared(mod, inp, one_shot: dict, what: str) -> None:
    """The three ops through one prepared step: the same kernels on the same grids as the one-shot
    ops, so the same bits."""
    step = mod.prepare(inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.kv_lens, inp.op_mask)
    # The one-shot tree_attention knows no prefix, so its bucket is the short-context one: with a
    # tuned table that bucket may run another tiling than this step's (long-context) bucket.
    tree_only = mod.prepare(inp.qo_indptr, tree_mask=inp.op_mask, num_tokens=inp.q.shape[0])
    q, kv_cache, k_tree, kw = inp.q, inp.kv_cache, inp.k_tree, inp.kv_kwargs
    for op, run, same_tiling in (
            ("tree_attention", lambda **o: step.tree(q, k_tree, **kw, **o), tree_only.plan is step.plan),
            ("verify_attention", lambda **o: step.verify(q, kv_cache, k_tree, **kw, **o), True),
            ("prefix_attention", lambda **o: step.prefix(q, kv_cache, **kw, **o), True)):
        out, lse = inp.outputs()
        run(out=out, lse=lse)
        assert_all_written(out, f"{what}: prepared {op} out")
        if same_tiling:
            assert torch.equal(out, one_shot[op][0]) and torch.equal(lse, one_shot[op][1]), \
                f"{what}: prepared {op} differs from the one-shot op"
        else:
            assert_close_attention(out, lse, *one_shot[op][2], **tolerances(mod.spec),
                                   what=f"{what}: prepared {op} (the step's tiling)")


def describe(spec_name, inp, kind) -> str:
    sizes = inp.qo_indptr.diff().tolist()
    return f"{spec_name} B={len(sizes)} T={sizes} L={inp.kv_lens.tolist()} P={inp.page_size} {kind}"


# KGEN_TEST_RANDOM_SCALE scales the counts (e.g. 0.3 for a second pass with another arch's plan).
_SCALE = float(os.environ.get("KGEN_TEST_RANDOM_SCALE") or 1)


@pytest.mark.parametrize("spec_name,case", [(s, i) for s, n in RANDOM_CASES.items()
                                            for i in range(max(1, round(n * _SCALE)))])
def test_random_batches_match_the_reference(module_for, cuda, seed, spec_name, case):
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    sizes, lens, kind = random_batch(dims, random.Random(seed))
    inp = make_verify_inputs(dims, sizes, lens, tree_kind=kind, device=cuda, generator=generator(cuda, seed))
    check_ops(mod, inp, describe(spec_name, inp, kind))


def edge_batches(n: int, rng: random.Random) -> dict[str, tuple[list[int], list[int]]]:
    """Named (tree sizes, prefix lengths) for a dynamic tree of up to n nodes."""
    many = [rng.randint(0, min(n, 24)) for _ in range(64)]
    many[0] = max(1, many[0])
    return {
        "L0_T1": ([1], [0]),
        "no_prefix": ([3, n, 1], [0, 0, 0]),
        "T_max": ([n], [100]),
        "T0_requests": ([0, min(5, n), 0, min(3, n), 0], [10, 0, 7, 33, 0]),
        "L_not_tile_multiple": ([min(4, n)] * 9, [1, 31, 33, 63, 65, 127, 129, 1000, 4097]),
        "B64_mixed": (many, [rng.choice([0, 1, rng.randint(1, 3000)]) for _ in many]),
    }


@pytest.mark.parametrize("edge", list(edge_batches(8, random.Random(0))))
@pytest.mark.parametrize("spec_name", DYNAMIC_SPECS)
def test_edge_batches_match_the_reference(module_for, cuda, seed, spec_name, edge):
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    rng = random.Random(seed)
    sizes, lens = edge_batches(dims.max_nodes, rng)[edge]
    kind = rng.choice(TREE_KINDS)
    inp = make_verify_inputs(dims, sizes, lens, tree_kind=kind, device=cuda, generator=generator(cuda, seed))
    check_ops(mod, inp, f"{edge}: {describe(spec_name, inp, kind)}")


def halved_by_the_rule(step, heads: int, sizes: list[int], length: int) -> bool:
    """Whether tests/schedule_rule.py halves this batch's prefixes in `step`'s plan (a row tile's
    splits lie all requests' row tiles apart, not its request's)."""
    tiles = step.plan.tiles
    _, meta = schedule_items(heads, tiles.bm, tiles.bn, sizes, [length] * len(sizes), step.target_ctas, 1,
                             tiles.cluster)
    return meta[0][1] > 1 and meta[0][2] != meta[0][3]


@pytest.mark.parametrize("spec_name", ["glm5_sm120", "glm5_tp4_sm120", "glm5_dsa_fp8_sm120"])
def test_a_batch_just_past_a_wave_of_row_tiles_is_halved_and_matches_the_reference(module_for, cuda, seed,
                                                                                  spec_name):
    """Row tiles just past one wave of CTAs: the schedule halves every request's prefix (pieces n/2,
    n/4, n/8 and the rest, run big ones first: bench/NOTES.md v65) and the combine finds a row tile's
    pieces all requests' row tiles apart. Trees of 16 tokens (or the spec's most), one row tile more
    than a wave holds, one prefix length of 4-12k tokens that the rule halves (ragged batches, and
    some lengths, keep equal splits)."""
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    rng = random.Random(seed)
    tokens, sizes, length = min(dims.max_nodes, 16), [min(dims.max_nodes, 16)], 4200
    for _ in range(4):  # the batch's bucket may run another tiling, with another wave
        inp = make_verify_inputs(dims, sizes, [length] * len(sizes), device=cuda, generator=generator(cuda, seed))
        step = mod.prepare(inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.kv_lens, inp.op_mask)
        per_request = math.ceil(tokens * dims.num_heads / step.plan.tiles.bm)
        if per_request * len(sizes) <= step.target_ctas:
            sizes = [tokens] * (step.target_ctas // per_request + 1)
        elif halved_by_the_rule(step, dims.num_heads, sizes, length):
            break
        else:
            length = rng.choice([n for n in range(4200, 12000, 8) if halved_by_the_rule(step, dims.num_heads, sizes, n)])
    assert halved_by_the_rule(step, dims.num_heads, sizes, length), (sizes, length)
    check_ops(mod, inp, f"halved: {describe(spec_name, inp, 'random')}")


@pytest.mark.parametrize("spec_name", DYNAMIC_SPECS)
def test_rows_that_see_nothing_get_zero_and_minus_inf(module_for, cuda, seed, spec_name):
    mod = module_for(spec_name)
    inp = make_verify_inputs(Dims.of(mod.spec), [4, 3], [0, 5], device=cuda, generator=generator(cuda, seed))
    inp.tree_mask[1] = 0  # no prefix, no tree token: verify and tree rows 1 are empty
    inp.tree_mask[5] = 0  # a prefix only: tree row 5 is empty
    inp.parents = None
    check_ops(mod, inp, f"blind rows: {describe(spec_name, inp, 'random')}")


@pytest.mark.parametrize("spec_name,sizes,lens", [
    ("glm5_sm120", [16], [131072]),
    ("glm5_sm120", [64, 7], [131071, 65537]),
    ("glm5_tp4_sm120", [256], [131072]),
    ("deepseek_v3_sm120", [16], [131067]),
    ("glm5_p16_sm120", [16, 1], [100003, 131072]),
    ("glm5_static5_sm120", [5, 5], [131072, 77]),
    ("glm5_fp8_sm120", [16], [131072]),
    ("glm5_fp8_p64_sm120", [16, 3], [100003, 4097]),
    ("glm5_fp8_mma_e4m3_sm120", [16, 3], [131072, 4097]),
    ("glm5_p64_sm120", [16, 1], [131072, 100003]),
    ("glm5_dsa_fp8_sm120", [16], [131072]),
    ("glm5_dsa_fp8_sm120", [64, 3], [100003, 4097]),
    ("glm5_dsa_e4m3_sm120", [16, 3], [131072, 4097]),
])
def test_long_prefixes_match_the_reference(module_for, cuda, seed, spec_name, sizes, lens):
    mod = module_for(spec_name)
    inp = make_verify_inputs(Dims.of(mod.spec), sizes, lens, device=cuda, generator=generator(cuda, seed))
    check_ops(mod, inp, describe(spec_name, inp, "random"))


def test_ops_allocate_outputs_when_none_are_given(module_for, cuda, seed):
    mod = module_for("glm5_sm120")
    inp = make_verify_inputs(Dims.of(mod.spec), [7, 30], [300, 45], device=cuda, generator=generator(cuda, seed))
    o, lse = mod.verify_attention(*inp.verify_args())
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32 and o.device == lse.device == inp.q.device
    assert_close_attention(o, lse, *inp.verify_ref(), what="verify_attention without out=/lse=")


def load(buffers: dict, inp) -> None:
    """Copy a batch into the captured buffers; kv_indices past the batch's pages get an unused page."""
    for name, buf in buffers.items():
        src = getattr(inp, name)
        if name == "kv_indices":
            spare = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
            spare[src.long()] = False
            buf.fill_(int(spare.nonzero()[0]))
            buf[:src.numel()] = src
        else:
            buf.copy_(src)


@pytest.mark.parametrize("spec_name", ["glm5_sm120", "glm5_p16_sm120", "deepseek_v3_sm120", "glm5_static5_sm120",
                                       "glm5_fp8_sm120", "glm5_dsa_fp8_sm120"])
def test_cuda_graph_replays_with_new_lengths_pages_and_masks(module_for, cuda, seed, spec_name):
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    rng, g = random.Random(seed), generator(cuda, seed)
    sizes = [dims.max_nodes if dims.parents else rng.randint(1, dims.max_nodes) for _ in range(4)]
    max_len = 3000
    pool = len(sizes) * math.ceil(max_len / dims.page_size) + 4
    kv_scale = 1.0 if dims.scales == "per_block" else rng.uniform(0.25, 4.0)  # baked into the graph

    def batch(lens):
        inp = make_verify_inputs(replace(dims, kv_dtype="bfloat16"), sizes, lens, tree_kind=rng.choice(TREE_KINDS),
                                 device=cuda, generator=g, num_pages=pool)
        return inp.stored_as(dims, kv_scale)

    captured = batch([rng.randint(0, 64) for _ in sizes])  # captured with short prefixes, replayed with long
    buffers = {name: getattr(captured, name).clone() for name in
               ("q", "kv_cache", "k_tree", "qo_indptr", "kv_indptr", "kv_lens", "tree_mask")}
    buffers["kv_indices"] = torch.empty(pool, dtype=torch.int32, device=cuda)
    load(buffers, captured)
    args = [buffers[n] for n in ("q", "kv_cache", "k_tree", "qo_indptr", "kv_indptr", "kv_indices", "kv_lens")]
    args.append(None if captured.static_tree else buffers["tree_mask"])
    out, lse = captured.outputs()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as torch advises before capture
        mod.verify_attention(*args, **captured.kv_kwargs, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.verify_attention(*args, **captured.kv_kwargs, out=out, lse=lse)

    for replay, lens in enumerate([[max_len] * 4, [0, max_len, 1, max_len - 1],
                                   [rng.randint(0, max_len) for _ in sizes], [0] * 4]):
        inp = batch(lens)
        load(buffers, inp)
        poison_(out)
        poison_(lse)
        graph.replay()
        what = f"graph replay {replay}: {describe(spec_name, inp, 'replayed')}"
        assert_all_written(out, f"{what} out")
        assert_all_written(lse, f"{what} lse")
        assert_close_attention(out, lse, *inp.verify_ref(), **tolerances(mod.spec), what=what)


@pytest.mark.parametrize("spec_name", ["glm5_fp8_sm120", "glm5_fp8_mma_e4m3_sm120"])
def test_fp8_error_against_the_bf16_reference(module_for, cuda, seed, spec_name):
    """What fp8 KV costs end to end: the fp8 op on the quantized cache against the float64
    reference on the original bf16 cache (the tolerance above is against the dequantized one)."""
    mod = module_for(spec_name)
    inp = make_verify_inputs(Dims.of(module_for("glm5_sm120").spec), [16, 16], [32768, 4096], device=cuda,
                             generator=generator(cuda, seed))
    scale = float(inp.kv_cache.nan_to_num().abs().max()) / 448  # as a calibrated per-tensor scale would be
    o, lse = mod.verify_attention(*inp.to_fp8(scale).verify_args(), kv_scale=scale)
    assert_close_attention(o, lse, *inp.verify_ref(), o_tol=8e-2, lse_tol=1e-1, what="fp8 vs bf16 reference")


# ---- bad input -----------------------------------------------------------------------------

OP_ARGS = {
    "verify_attention": ("q", "kv_cache", "k_tree", "qo_indptr", "kv_indptr", "kv_indices", "kv_lens", "tree_mask"),
    "prefix_attention": ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_lens"),
    "tree_attention": ("q", "k_tree", "qo_indptr", "tree_mask"),
}

# (what is wrong, the argument the error must name, how to break a valid call's keyword arguments)
BAD_INPUTS = [
    ("q is float16", "q", lambda a: {"q": a["q"].half()}),
    ("q is on the CPU", "q", lambda a: {"q": a["q"].cpu()}),
    ("q is not a tensor", "q", lambda a: {"q": None}),
    ("q has rank 2", "q", lambda a: {"q": a["q"][:, 0].contiguous()}),
    ("q has twice the spec's heads", "q", lambda a: {"q": a["q"].repeat(1, 2, 1)}),
    ("q is not contiguous", "q", lambda a: {"q": a["q"].transpose(0, 1).contiguous().transpose(0, 1)}),
    ("kv_cache is 512 wide", "kv_cache", lambda a: {"kv_cache": a["kv_cache"][:, :512].contiguous()}),
    ("kv_cache is float32", "kv_cache", lambda a: {"kv_cache": a["kv_cache"].float()}),
    ("k_tree misses a row", "k_tree", lambda a: {"k_tree": a["k_tree"][:-1].contiguous()}),
    ("qo_indptr is int64", "qo_indptr", lambda a: {"qo_indptr": a["qo_indptr"].long()}),
    ("kv_indptr has B entries", "kv_indptr", lambda a: {"kv_indptr": a["kv_indptr"][:-1].contiguous()}),
    ("kv_lens has B - 1 entries", "kv_lens", lambda a: {"kv_lens": a["kv_lens"][:-1].contiguous()}),
    ("kv_indices is int64", "kv_indices", lambda a: {"kv_indices": a["kv_indices"].long()}),
    ("kv_indices has rank 2", "kv_indices", lambda a: {"kv_indices": a["kv_indices"].unsqueeze(0)}),
    ("tree_mask is narrower than max_nodes", "tree_mask", lambda a: {"tree_mask": a["tree_mask"][:, :1].contiguous()}),
    ("tree_mask misses a row", "tree_mask", lambda a: {"tree_mask": a["tree_mask"][:-1].contiguous()}),
    ("tree_mask is int64", "tree_mask", lambda a: {"tree_mask": a["tree_mask"].long()}),
    ("out is float32", "out", lambda a: {"out": torch.empty(*a["q"].shape[:2], 512, device=a["q"].device)}),
    ("lse has an extra head", "lse", lambda a: {"lse": torch.empty(a["q"].shape[0], a["q"].shape[1] + 1,
                                                                   device=a["q"].device)}),
]


@pytest.mark.parametrize("op,wrong,arg,breaks", [
    (op, wrong, arg, breaks) for op, names in OP_ARGS.items() for wrong, arg, breaks in BAD_INPUTS
    if arg in names + ("out", "lse")
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_an_error_naming_the_argument(module_for, cuda, seed, op, wrong, arg, breaks):
    mod = module_for("glm5_sm120")  # max_nodes 64: two mask words per row
    inp = make_verify_inputs(Dims.of(mod.spec), [5, 64, 2], [40, 7, 0], device=cuda, generator=generator(cuda, seed))
    kwargs = {name: getattr(inp, name) for name in OP_ARGS[op]}
    kwargs.update(breaks(kwargs))
    with pytest.raises((ValueError, TypeError), match=rf"\b{arg}\b"):
        getattr(mod, op)(**kwargs)
        torch.cuda.synchronize()


@pytest.mark.parametrize("arg,breaks", [
    ("kv_indices", lambda inp: inp.kv_indices.fill_(inp.kv_cache.shape[0] + 1000)),
    ("kv_lens", lambda inp: inp.kv_lens.fill_(-3)),
    ("kv_lens", lambda inp: inp.kv_lens.add_(1000)),  # more tokens than the request's pages hold
], ids=["page_past_kv_cache", "negative_length", "length_past_pages"])
def test_validate_mode_checks_indices_on_the_device(module_for, cuda, seed, monkeypatch, arg, breaks):
    monkeypatch.setenv("KGEN_VALIDATE", "1")
    mod = module_for("glm5_p16_sm120")
    inp = make_verify_inputs(Dims.of(mod.spec), [5, 3], [40, 7], device=cuda, generator=generator(cuda, seed))
    breaks(inp)
    with pytest.raises(ValueError, match=rf"\b{arg}\b"):
        mod.verify_attention(*inp.verify_args())
        torch.cuda.synchronize()


@pytest.mark.parametrize("spec_name,change,arg,error", [
    ("glm5_sm120", {"kv_scale": 0.5}, "kv_scale", ValueError),  # a bf16 cache has no scale
    ("glm5_fp8_sm120", {"kv_scale": float("inf")}, "kv_scale", ValueError),
    ("glm5_fp8_sm120", {"kv_scale": "tensor"}, "kv_scale", TypeError),
    ("glm5_fp8_sm120", {"kv_cache": "bf16"}, "kv_cache", TypeError),  # an fp8 spec reads e4m3 bytes
    ("glm5_fp8_sm120", {"k_tree": "float32"}, "k_tree", TypeError),
    ("glm5_dsa_fp8_sm120", {"kv_scale": 0.5}, "kv_scale", ValueError),  # DSA rows carry their own scales
    ("glm5_dsa_fp8_sm120", {"kv_cache": "bf16"}, "kv_cache", TypeError),  # uint8 rows, not bf16 values
    ("glm5_dsa_fp8_sm120", {"kv_cache": "e4m3"}, "kv_cache", TypeError),  # nor e4m3 bytes without scales
    ("glm5_dsa_fp8_sm120", {"kv_cache": "rows576"}, "kv_cache", ValueError),  # 656-byte rows
    ("glm5_dsa_fp8_sm120", {"k_tree": "tree576"}, "k_tree", ValueError),  # uint8 tree rows are 656 bytes too
    ("glm5_dsa_fp8_sm120", {"k_tree": "float32"}, "k_tree", TypeError),
])
def test_kv_dtype_and_scale_errors_name_the_argument(module_for, cuda, seed, spec_name, change, arg, error):
    mod = module_for(spec_name)
    inp = make_verify_inputs(Dims.of(mod.spec), [5, 2], [40, 7], device=cuda, generator=generator(cuda, seed))
    kwargs = {name: getattr(inp, name) for name in OP_ARGS["verify_attention"]} | inp.kv_kwargs
    fills = {"tensor": torch.tensor(1.0, device=cuda), "bf16": torch.zeros(inp.kv_cache.shape, dtype=torch.bfloat16,
                                                                          device=cuda),
             "float32": inp.k_tree.float(), "e4m3": torch.zeros(inp.kv_cache.shape[0], 576, dtype=torch.float8_e4m3fn,
                                                                  device=cuda),
             "rows576": torch.zeros(inp.kv_cache.shape[0], 576, dtype=torch.uint8, device=cuda),
             "tree576": torch.zeros(inp.k_tree.shape[0], 576, dtype=torch.uint8, device=cuda)}
    kwargs.update({k: fills.get(v, v) if isinstance(v, str) else v for k, v in change.items()})
    with pytest.raises(error, match=rf"\b{arg}\b"):
        mod.verify_attention(**kwargs)


# Every tiling kgen tune may pick for sm_120 (both mma.sync loop designs), whatever the plan of the
# run: the heuristic sm_120 plan is one of them, the others run only here.
SM120_TILINGS = ["mma_sync:32,32,2,2,1", "mma_sync:32,16,2,4,1", "mma_sync:32,32,2,2,1,2", "mma_sync:32,32,2,2,1,4",
                 "mma_sync:32,16,2,4,1,4", "mma_sync:16,32,1,2,1", "overlap:16,4,1,1", "overlap:16,4,0,1",
                 "overlap:32,2,0,1"]
_TILED: dict = {}  # (spec, arch, tiles) -> module, compiled once per session


@pytest.mark.parametrize("case", range(2))
@pytest.mark.parametrize("tiles", SM120_TILINGS)
def test_every_sm120_tiling_matches_the_reference(cuda, seed, tiles, case):
    """glm5_sm120 (H = 8): edge batches and a random batch per case. (KGEN_TEST_PLAN_ARCH=sm_120
    runs the whole suite, every spec, with the sm_120 plan's own tiling.)"""
    check_tiling(cuda, seed, "glm5_sm120", "sm_120", tiles)


# The mma.sync loop in clusters of 4 (multicast copies, pad row tiles) over the other row formats.
@pytest.mark.parametrize("spec_name", ["glm5_fp8_p64_sm120", "glm5_dsa_fp8_sm120", "glm5_dsa_e4m3_sm120",
                                       "glm5_tp4_sm120"])
def test_clusters_over_every_row_format(cuda, seed, spec_name):
    check_tiling(cuda, seed, spec_name, "sm_120", "mma_sync:32,32,2,2,1,4")


def check_tiling(cuda, seed: int, spec_name: str, arch: str, tiles: str) -> None:
    """Edge batches and a random batch through the spec's `arch` plan with `tiles` (compiled once)."""
    key = (spec_name, arch, tiles)
    if key not in _TILED:
        _TILED[key] = kgen.jit(spec_named(spec_name), arch=arch, tiles=designs.parse(tiles))
    mod = _TILED[key]
    dims = Dims.of(mod.spec)
    rng = random.Random(seed)
    for what, (sizes, lens) in [*edge_batches(dims.max_nodes, rng).items(), ("random", random_batch(dims, rng)[:2])]:
        kind = rng.choice(TREE_KINDS)
        inp = make_verify_inputs(dims, sizes, lens, tree_kind=kind, device=cuda,
                                 generator=generator(cuda, rng.randrange(2**62)))
        check_ops(mod, inp, f"{spec_name} {tiles} {what}: {describe(spec_name, inp, kind)}")


# The sm_90 loops where kgen tune may pick a tiling the heuristic plan does not: the wgmma loop over
# fp8 rows (its producer converts the e4m3 bytes to bf16, exactly: per-tensor rows at both page sizes
# and the DSA pool's 656-B rows, per-block scales in fp32) at both ring depths, and the seesaw loop:
# bf16 rows at H = 8, 16 and 128, page sizes 1 and 64, both ring depths at H = 8; per-tensor fp8 rows
# at both page sizes and the DSA pool's rows (its one ring depth beside the raw stages); and the
# mma.sync loop over the DSA pool's rows as the sm_90 plan builds it, the block scales entering P·V
# through V (the sm_120 plan keeps them in P: KGEN_TEST_PLAN_ARCH=sm_120 runs that path); its 16-row
# tiles (decode's tuned choice) over every row format the tables cover.
SM90_CASES = [*((spec, tiles) for spec in ("glm5_fp8_sm120", "glm5_fp8_p64_sm120", "glm5_dsa_fp8_sm120")
                for tiles in ("wgmma:32,2,1", "wgmma:32,3,1")),
              ("glm5_sm120", "seesaw:32,3,1"), ("glm5_sm120", "seesaw:32,4,1"), ("glm5_p64_sm120", "seesaw:32,4,1"),
              ("glm5_tp4_sm120", "seesaw:32,4,1"), ("deepseek_v3_sm120", "seesaw:32,4,1"),
              ("glm5_fp8_sm120", "seesaw:32,3,1"), ("glm5_fp8_p64_sm120", "seesaw:32,3,1"),
              ("glm5_dsa_fp8_sm120", "seesaw:32,3,1"), ("glm5_dsa_fp8_sm120", "mma_sync:32,32,2,3,1"),
              *((spec, "mma_sync:16,32,1,4,1") for spec in ("glm5_sm120", "glm5_p64_sm120", "glm5_fp8_sm120",
                                                             "glm5_dsa_fp8_sm120"))]


@pytest.mark.parametrize("case", range(2))
@pytest.mark.parametrize("spec_name, tiles", SM90_CASES)
def test_the_sm90_loops_match_the_reference(cuda, seed, spec_name, tiles, case):
    if torch.cuda.get_device_capability(cuda) != (9, 0):
        pytest.skip("the wgmma loops need sm_90 (an H100 / H200)")
    check_tiling(cuda, seed, spec_name, "sm_90", tiles)
