"""Sparse (DSA) tree verify on the GPU (DESIGN §12) against the reference, for the GPU's own plan
and the sm_120 plan, every sparse cache format, the union kernel and the per-token-gather one:
lists with heavy and with no overlap, -1 anywhere, slots of other requests, L < K', T = 1, trees
up to max_nodes, B up to 64, empty rows, poisoned outputs, permuted pages, duplicate and
out-of-range slots under KGEN_VALIDATE=1, graph replays with refilled lists."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
import yaml

import kgen
from kgen.sparse import prefers_union
from kgen.sparse_plan import tile_tokens
from kgen.sparse_testing import SparseInputs, make_sparse_inputs
from kgen.spec import parse_spec
from kgen.accuracy import assert_all_written, assert_close_attention, tolerances
from kgen.inputs import Dims, poison_
from kgen.timing import capture

from conftest import SPEC_DIR

pytestmark = pytest.mark.gpu

# name -> changes to the shipped sparse spec (model and cache fields, tree size)
SPARSE_SPECS = {
    "glm5_dsa_sm120": {},  # shipped: the DSA pool's 656-B fp8 rows (per-block scales)
    "glm5_dsa_bf16_sm120": {"cache": {"kv_dtype": "bfloat16", "scales": None}},  # the pool's bf16 rows
    "glm5_dsa_fp8pt_sm120": {"cache": {"scales": "per_tensor"}},  # fp8 rows with one kv_scale per layer
    "glm5_dsa_tp4_p1_sm120": {"model": {"num_q_heads": 16}, "cache": {"page_size": 1, "kv_dtype": "bfloat16",
                                                                      "scales": None}, "tree": {"max_nodes": 256}},
    "glm5_dsa_h4_sm120": {"model": {"num_q_heads": 4}},  # 4 heads a rank (TP16): 16-row tiles of 4 tokens
}
PLAN_ARCHS = [None, "sm_120"]  # the GPU's own plan, and the sm_120 plan run on it


def sparse_spec(name: str) -> kgen.Spec:
    data = yaml.safe_load((SPEC_DIR / "glm5_dsa_sm120.yaml").read_text())
    data["name"] = name
    for section, fields in SPARSE_SPECS[name].items():
        data[section].update(fields)
    return parse_spec(data, f"glm5_dsa_sm120.yaml with {SPARSE_SPECS[name]}")


@pytest.fixture(scope="module")
def sparse_module(cuda):
    modules = {}

    def get(name: str, arch: str | None):
        if (name, arch) not in modules:
            modules[name, arch] = kgen.jit(sparse_spec(name), arch=arch)
        return modules[name, arch]

    return get


# How far two union calls on the same inputs may differ in o: its key order follows the race of its
# hash-set inserts (bench/NOTES.md v58), so the last bits move; 4e-3 covers a bf16 rounding step at
# |o| <= 1 (the spread seen: 4.9e-4).
UNION_SPREAD = {"atol": 4e-3, "rtol": 1e-2}


def run_and_check(mod, x, what: str, union: bool = True, step=None):
    out, lse = x.base.outputs()
    step = step or mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=union)
    step.verify(x.base.q, x.base.kv_cache, x.base.k_tree, **x.base.kv_kwargs, out=out, lse=lse)
    torch.cuda.synchronize()
    assert_all_written(out, f"{what} out")
    assert_all_written(lse, f"{what} lse")
    assert_close_attention(out, lse, *x.ref(), **tolerances(mod.spec), what=what)


# (tree sizes, prefix lengths, list width, shared fraction, -1 fraction, foreign fraction)
CASES = {
    "heavy overlap": ([16], [20000], 2048, 0.9, 0.0, 0.0),
    "no overlap": ([16, 9], [40000, 30000], 2048, 0.0, 0.0, 0.0),
    "holes and foreign slots": ([16, 5, 12], [9000, 7000, 5000], 2048, 0.6, 0.1, 0.2),
    "L < K": ([16, 3, 1], [1000, 2047, 0], 2048, 0.5, 0.0, 0.0),
    "decode T = 1": ([1] * 5, [3000, 50, 9000, 2048, 2049], 2048, 0.5, 0.05, 0.0),
    "K' < K, odd": ([7, 16], [5000, 3000], 333, 0.5, 0.05, 0.1),
    "max tree": ("max", [6000, 1000], 2048, 0.7, 0.02, 0.0),
    "ragged, empty requests": ([0, 16, 0, 3, 64], [500, 9000, 0, 100, 3000], 2048, 0.7, 0.05, 0.0),
}


@pytest.mark.parametrize("arch", PLAN_ARCHS, ids=["own_plan", "sm120_plan"])
@pytest.mark.parametrize("spec_name", list(SPARSE_SPECS))
@pytest.mark.parametrize("case", list(CASES))
def test_sparse_verify_matches_the_reference(sparse_module, cuda, seed, spec_name, arch, case):
    mod = sparse_module(spec_name, arch)
    sizes, lens, width, shared, holes, foreign = CASES[case]
    n = mod.spec.tree.nodes
    sizes = [n, min(n, 37)] if sizes == "max" else [min(t, n) for t in sizes]
    g = torch.Generator(cuda).manual_seed(seed)
    x = make_sparse_inputs(mod.spec, sizes, lens, width, shared=shared, holes=holes, foreign=foreign,
                           window=256, device=cuda, generator=g)
    for union in (True, False):
        run_and_check(mod, x, f"{spec_name} ({arch or 'own'} plan) {case} union={union} "
                              f"unions={x.union_sizes()}", union)


@pytest.mark.parametrize("arch", PLAN_ARCHS, ids=["own_plan", "sm120_plan"])
def test_one_request_s_tree_as_a_split_of_its_own_and_on_the_last_split(sparse_module, cuda, seed, arch):
    """One request of 1 or 16 tokens gets its row tiles' trees as splits of their own (the wave has
    room: bench/NOTES.md v112), one of 64 keeps them on the last splits; all match the reference."""
    mod = sparse_module("glm5_dsa_sm120", arch)
    g = torch.Generator(cuda).manual_seed(seed)
    apart = []
    for tokens in (1, 16, 64):
        x = make_sparse_inputs(mod.spec, [tokens], [30000], 2048, shared=0.7, holes=0.02, window=256, device=cuda,
                               generator=g)
        for union in (True, False):
            step = mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=union)
            apart.append(step.tree_apart)
            run_and_check(mod, x, f"({arch or 'own'} plan) one request of {tokens}, union={union}, "
                                  f"tree apart={step.tree_apart}", step=step)
    # T1 always fits (33 items a wave); T16 fits the sm_90 plan's wave exactly on 132 SMs (the H100 / H200:
    # 8 x 33 = 264 items, two CTAs an SM); T64's splits fill the wave
    assert apart[:2] == [True, True] and apart[-2:] == [False, False], apart


@pytest.mark.parametrize("arch", PLAN_ARCHS, ids=["own_plan", "sm120_plan"])
def test_random_batches_up_to_64_requests(sparse_module, cuda, seed, arch):
    mod = sparse_module("glm5_dsa_sm120", arch)
    rng, g = random.Random(seed), torch.Generator(cuda).manual_seed(seed)
    for _ in range(3):
        batch = rng.choice([2, 8, 33, 64])
        sizes = [rng.choice([0, 1, 2, 16, 17, 64, rng.randint(0, 64)]) for _ in range(batch)]
        lens = [rng.choice([0, 1, 63, 2048, rng.randint(0, 12000)]) for _ in range(batch)]
        width = rng.choice([2048, 2048, 512, 100])
        x = make_sparse_inputs(mod.spec, sizes, lens, width, shared=rng.random(), holes=rng.random() * 0.2,
                               foreign=rng.random() * 0.2, window=rng.randint(0, 512), device=cuda, generator=g,
                               tree_kind=rng.choice(["random", "chain", "star", "bits"]))
        for union in (True, False):
            run_and_check(mod, x, f"B={batch} T={sizes} L={lens} K'={width} union={union}", union)


@pytest.mark.parametrize("arch", PLAN_ARCHS, ids=["own_plan", "sm120_plan"])
def test_a_split_whose_list_outgrows_the_set_runs_in_rounds(sparse_module, cuda, seed, arch):
    """One split per request (target_ctas 1): at 4 heads a 16-row tile holds 4 tokens, whose disjoint
    lists of 2048 name 8192 slots, twice a round's set (4096 keys), so the union's split runs in
    rounds (the partition halved, each round cleared after the last one's list was written:
    bench/NOTES.md v83's race); the gather's splits stay within one list's capacity."""
    mod = sparse_module("glm5_dsa_h4_sm120", arch)
    assert tile_tokens(4, mod.plan.variant("sparse_combine").constants["BM"]) == 4
    x = make_sparse_inputs(mod.spec, [16, 4], [60000, 30000], 2048, shared=0.0, device=cuda,
                           generator=torch.Generator(cuda).manual_seed(seed))
    for union in (True, False):
        step = mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=union)
        step._block.values.target_ctas = 1  # the schedule's one knob: a request's tile gets one split
        run_and_check(mod, x, f"one split per request, union={union}", union, step)


def test_rows_that_list_nothing_and_see_no_tree_token_get_zero_and_minus_inf(sparse_module, cuda, seed):
    mod = sparse_module("glm5_dsa_sm120", None)
    x = make_sparse_inputs(mod.spec, [8, 3], [5000, 4000], 2048, tree_kind="bits", device=cuda,
                           generator=torch.Generator(cuda).manual_seed(seed))
    for row in (0, 5, 9):  # nothing listed, nothing visible
        x.topk_indices[row] = -1
        x.base.tree_mask[row] = 0
    x.topk_indices[2] = -1  # nothing listed, but its tree
    o, lse = x.ref()
    assert torch.isinf(lse[[0, 5, 9]]).all() and torch.isfinite(lse[2]).all()
    run_and_check(mod, x, "empty rows")


def test_kgen_validate_rejects_duplicate_and_out_of_range_slots(sparse_module, cuda, seed, monkeypatch):
    mod = sparse_module("glm5_dsa_sm120", None)
    monkeypatch.setenv("KGEN_VALIDATE", "1")
    x = make_sparse_inputs(mod.spec, [4], [3000], 64, device=cuda, generator=torch.Generator(cuda).manual_seed(seed))
    run_and_check(mod, x, "valid lists under KGEN_VALIDATE")
    dup = x.topk_indices.clone()
    dup[2, 7] = dup[2, 30]
    with pytest.raises(ValueError, match="topk_indices: row 2 lists a slot more than once"):
        mod.sparse_verify_attention(*x.args()[:4], dup, x.base.op_mask)
    far = x.topk_indices.clone()
    far[1, 3] = x.base.kv_cache.shape[0]
    with pytest.raises(ValueError, match="topk_indices: a slot lies outside kv_cache"):
        mod.sparse_verify_attention(*x.args()[:4], far, x.base.op_mask)


def test_bad_arguments_get_one_line_errors(sparse_module, cuda, seed):
    mod = sparse_module("glm5_dsa_sm120", None)
    x = make_sparse_inputs(mod.spec, [4], [300], 64, device=cuda, generator=torch.Generator(cuda).manual_seed(seed))
    q, cache, k_tree, qo, topk, mask = x.args()
    with pytest.raises(TypeError, match="topk_indices: expected dtype torch.int32"):
        mod.sparse_verify_attention(q, cache, k_tree, qo, topk.long(), mask)
    with pytest.raises(ValueError, match="index_topk 2048"):
        mod.prepare_sparse(qo, torch.zeros(4, 2049, dtype=torch.int32, device=cuda), mask)
    with pytest.raises(ValueError, match="tree_mask: expected size 4 in dim 0"):
        mod.prepare_sparse(qo, topk, mask[:3])
    with pytest.raises(ValueError, match="q: expected size 4 in dim 0"):
        mod.sparse_verify_attention(q[:3], cache, k_tree, qo, topk, mask)
    with pytest.raises(ValueError, match="kv_scale"):
        mod.sparse_verify_attention(q, cache, k_tree, qo, topk, mask, kv_scale=2.0)


def test_the_custom_op_passes_opcheck_and_matches(sparse_module, cuda, seed):
    mod = sparse_module("glm5_dsa_sm120", None)
    x = make_sparse_inputs(mod.spec, [5, 2], [3000, 700], 512, holes=0.1, device=cuda,
                           generator=torch.Generator(cuda).manual_seed(seed))
    # eager against compiled calls at the union's own call-to-call spread, not bf16's default
    torch.library.opcheck(torch.ops.kgen.sparse_verify_attention, (*x.args(), mod.spec.name), **UNION_SPREAD)
    o, lse = torch.ops.kgen.sparse_verify_attention(*x.args(), mod.spec.name)
    assert_close_attention(o, lse, *x.ref(), what="torch.ops.kgen.sparse_verify_attention")


@pytest.mark.parametrize("arch", PLAN_ARCHS, ids=["own_plan", "sm120_plan"])
def test_repeated_calls_agree(sparse_module, cuda, seed, arch):
    """The same inputs, called again: the gather kernel gives the same bits; the union's key order
    follows the race of its hash-set inserts (bench/NOTES.md v58), so its calls may differ in the last
    bits only, each within DESIGN §6 of the reference."""
    mod = sparse_module("glm5_dsa_sm120", arch)
    g = torch.Generator(cuda).manual_seed(seed)
    for sizes, lens, width, shared in (([5, 2], [3000, 700], 512, 0.7), ([16, 16, 9], [40000, 9000, 20000], 2048, 0.5),
                                       ([16] * 8, [20000] * 8, 2048, 0.0)):
        x = make_sparse_inputs(mod.spec, sizes, lens, width, shared=shared, holes=0.1, device=cuda, generator=g)
        o_ref, lse_ref = x.ref()
        for union in (True, False):
            step = mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=union)
            calls = []
            for _ in range(4):
                out, lse = x.base.outputs()
                step.verify(x.base.q, x.base.kv_cache, x.base.k_tree, **x.base.kv_kwargs, out=out, lse=lse)
                what = f"T={sizes} L={lens} K'={width} shared={shared} union={union}, call {len(calls)}"
                assert_close_attention(out, lse, o_ref, lse_ref, **tolerances(mod.spec), what=what)
                calls.append((out, lse))
            if not union:
                assert all(torch.equal(o, calls[0][0]) and torch.equal(l, calls[0][1]) for o, l in calls), what
            else:
                for o, l in calls[1:]:
                    torch.testing.assert_close(o, calls[0][0], **UNION_SPREAD)
                    torch.testing.assert_close(l, calls[0][1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", PLAN_ARCHS, ids=["own_plan", "sm120_plan"])
@pytest.mark.parametrize("spec_name, union", [("glm5_dsa_sm120", True), ("glm5_dsa_bf16_sm120", False)],
                         ids=["union", "gather"])  # kernels both plans build with the table's read
def test_a_step_reads_its_work_items_from_its_schedule_table_while_it_matches_qo_indptr(sparse_module, cuda, seed,
                                                                                        arch, spec_name, union):
    """A prepared sparse step's kernel takes its work items from the step's schedule table: items
    spoiled in a current table spoil the call (so the table is what it reads), reschedule() mends
    it, and a qo_indptr refilled since the table was written makes the CTAs find their items
    themselves (templates/sparse_schedule.cuh)."""
    from kgen.sparse import sparse_workspace_layout
    from kgen.splitkv import table_items

    mod = sparse_module(spec_name, arch)
    g = torch.Generator(cuda).manual_seed(seed)
    first, second = (make_sparse_inputs(mod.spec, sizes, lens, 2048, shared=0.6, holes=0.05, device=cuda, generator=g)
                     for sizes, lens in (([16, 5, 9], [9000, 300, 4000]), ([9, 16, 5], [100, 12000, 2500])))
    meta = {"qo_indptr": first.base.qo_indptr.clone(), "topk": first.topk_indices.clone(),
            "mask": first.base.op_mask.clone()}
    step = mod.prepare_sparse(meta["qo_indptr"], meta["topk"], meta["mask"], union=union)
    _, req_meta, _, table, _ = sparse_workspace_layout(mod._sparse, step.grid, step.batch, step.union)
    assert step.schedule_table == step.workspace.data_ptr() + table
    items = table + table_items(step.batch)

    def call(x, *, spoiled=False):
        if spoiled:  # every CTA's item: none; and the partial states of the last call gone
            step.workspace[items:items + 16 * step.grid].view(torch.int32).fill_(-1)
            step.workspace[:req_meta].fill_(0xFF)
        out, lse = x.base.outputs()
        step.verify(x.base.q, x.base.kv_cache, x.base.k_tree, **x.base.kv_kwargs, out=out, lse=lse)
        torch.cuda.synchronize()
        return out, lse

    def check(x, what, **kwargs):
        assert_close_attention(*call(x, **kwargs), *x.ref(), **tolerances(mod.spec), what=what)

    check(first, "the first call (it writes the table)")
    out, _ = call(first, spoiled=True)
    assert out.float().isnan().any() or not torch.allclose(out.float(), first.ref()[0].float(), atol=0.1), \
        "a current table's items are what the kernel runs"
    step.reschedule()
    check(first, "rescheduled")
    meta["qo_indptr"].copy_(second.base.qo_indptr)
    meta["topk"].copy_(second.topk_indices)
    meta["mask"].copy_(second.base.op_mask)
    check(second, "refilled over a spoiled table", spoiled=True)
    step.reschedule()
    check(second, "refilled and rescheduled")


@pytest.mark.parametrize("union", [None, True, False], ids=["by_size", "union", "gather"])
def test_an_attention_call_is_two_launches(sparse_module, cuda, seed, union):
    mod = sparse_module("glm5_dsa_sm120", None)
    x = make_sparse_inputs(mod.spec, [16, 3], [5000, 100], 2048, device=cuda,
                           generator=torch.Generator(cuda).manual_seed(seed))
    step = mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=union)
    assert step.union == (prefers_union(mod._sparse, 19) if union is None else union)
    out, lse = x.base.outputs()
    k_tree = x.base.stored_k_tree  # as a server passes them (bf16 ones add the quantize's launches)
    run = lambda: step.verify(x.base.q, x.base.kv_cache, k_tree, out=out, lse=lse)  # noqa: E731
    run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel = "sparse_verify_attn__" if step.union else "sparse_gather_attn__"
    assert len(names) == 2 and names[0].startswith(kernel) and names[1].startswith("sparse_combine__"), names


@pytest.mark.parametrize("spec_name", ["glm5_dsa_sm120", "glm5_dsa_bf16_sm120", "glm5_dsa_fp8pt_sm120"])
def test_a_graph_replays_with_new_lists(sparse_module, cuda, seed, spec_name):
    """Two layers' calls of one step in one graph, replayed after new tree splits, lists, masks,
    queries and caches are copied into the captured tensors (each layer keeps its kv_scale)."""
    mod = sparse_module(spec_name, None)
    rng, g = random.Random(seed), torch.Generator(cuda).manual_seed(seed)
    dims = replace(Dims.of(mod.spec), kv_dtype="bfloat16")
    per_tensor = mod.spec.cache.kv_dtype == "float8_e4m3fn" and not mod.spec.cache.per_block
    scales = [rng.uniform(0.25, 4.0) if per_tensor else 1.0 for _ in range(2)]  # DSA rows carry their own
    sizes, pool_pages, width = [16, 9, 1, 30], 900, 2048

    def randn(t):
        return torch.randn(t.shape, generator=g, device=cuda, dtype=t.dtype)

    def batch():
        """Layer 0's and layer 1's inputs: the same metadata, each layer its own q, cache and keys."""
        tokens = list(sizes)
        rng.shuffle(tokens)  # the same 56 tokens, split otherwise
        x = make_sparse_inputs(dims, tokens, [rng.randint(0, 12000) for _ in tokens], width, shared=rng.random(),
                               holes=0.05, device=cuda, generator=g, num_pages=pool_pages,
                               tree_kind=rng.choice(["random", "bits"]))
        unused = x.base.kv_cache[:, 0].isnan()
        other = replace(x.base, q=randn(x.base.q), k_tree=randn(x.base.k_tree),
                        kv_cache=randn(x.base.kv_cache).masked_fill(unused[:, None], float("nan")))
        return [SparseInputs(b.stored_as(Dims.of(mod.spec), s), x.topk_indices) for b, s in zip((x.base, other), scales)]

    first = batch()
    meta = {"qo_indptr": first[0].base.qo_indptr.clone(), "topk": first[0].topk_indices.clone(),
            "mask": first[0].base.tree_mask.clone()}
    bufs = [{"q": x.base.q.clone(), "cache": x.base.kv_cache.clone(), "k_tree": x.base.k_tree.clone()} for x in first]
    step = mod.prepare_sparse(meta["qo_indptr"], meta["topk"], meta["mask"])
    outs = [first[0].base.outputs() for _ in first]

    def forward():
        for b, s, (o, l) in zip(bufs, scales, outs):
            step.verify(b["q"], b["cache"], b["k_tree"], kv_scale=s, out=o, lse=l)

    graph = capture(forward)
    for replay in range(3):
        new = batch()
        meta["qo_indptr"].copy_(new[0].base.qo_indptr)
        meta["topk"].copy_(new[0].topk_indices)
        meta["mask"].copy_(new[0].base.tree_mask)
        for b, x in zip(bufs, new):
            b["q"].copy_(x.base.q)
            b["cache"].copy_(x.base.kv_cache)
            b["k_tree"].copy_(x.base.k_tree)
        for o, l in outs:
            poison_(o)
            poison_(l)
        graph.replay()
        torch.cuda.synchronize()
        for layer, (x, (o, l)) in enumerate(zip(new, outs)):
            what = f"{spec_name} replay {replay} layer {layer} T={x.base.qo_indptr.diff().tolist()}"
            assert_all_written(o, f"{what} out")
            assert_all_written(l, f"{what} lse")
            assert_close_attention(o, l, *x.ref(), **tolerances(mod.spec), what=what)
