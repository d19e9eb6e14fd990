"""Prepared steps on the GPU (DESIGN §5 "Prepared steps"): an attention call is two launches, a
CUDA graph of several layers' calls replays correctly after the metadata is refilled in place,
and steps can share one workspace. (tests/test_attention_gpu.py runs every random and edge batch
through a prepared step too; tests/test_step.py checks the packing on the CPU.)"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from kgen.timing import capture
from kgen import fp8
from kgen.inputs import TREE_KINDS, Dims, make_verify_inputs, poison_
from kgen.accuracy import assert_all_written, assert_close_attention, tolerances

from test_attention_gpu import generator, load

pytestmark = pytest.mark.gpu


def gpu_activities(fn) -> list[str]:
    """Names of the kernels, memsets and copies that one call of `fn` puts on the GPU."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("spec_name", ["glm5_sm120", "glm5_static5_sm120", "glm5_fp8_sm120", "glm5_dsa_fp8_sm120"])
def test_an_attention_call_is_two_launches(module_for, cuda, seed, spec_name):
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    sizes = [dims.max_nodes] * 2 if dims.parents else [7, 30]
    x = make_verify_inputs(dims, sizes, [300, 45], device=cuda, generator=generator(cuda, seed))
    k_tree = x.k_tree  # in the cache's format: bf16 keys of an fp8 spec would add a quantize
    if x.kv_fp8 or x.kv_scaled:
        k_tree = fp8.quantize_rows(k_tree, x.value_dim) if x.kv_scaled else fp8.quantize(k_tree, x.kv_scale)
    out, lse = x.outputs()
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.op_mask)
    verify_args = (x.q, x.kv_cache, k_tree, *x.verify_args()[3:])
    calls = {
        "step.verify": ("verify_attn", lambda: step.verify(x.q, x.kv_cache, k_tree, **x.kv_kwargs, out=out, lse=lse)),
        "step.verify, new outputs": ("verify_attn", lambda: step.verify(x.q, x.kv_cache, k_tree, **x.kv_kwargs)),
        "step.prefix": ("prefix_attn", lambda: step.prefix(x.q, x.kv_cache, **x.kv_kwargs, out=out, lse=lse)),
        "step.tree": ("tree_attn", lambda: step.tree(x.q, k_tree, **x.kv_kwargs, out=out, lse=lse)),
        "verify_attention": ("verify_attn", lambda: mod.verify_attention(*verify_args, **x.kv_kwargs)),
        "prefix_attention": ("prefix_attn", lambda: mod.prefix_attention(*x.prefix_args(), **x.kv_kwargs)),
        "tree_attention": ("tree_attn", lambda: mod.tree_attention(x.q, k_tree, *x.tree_args()[2:], **x.kv_kwargs)),
        "torch.ops.kgen.verify_attention": ("verify_attn", lambda: torch.ops.kgen.verify_attention(
            *verify_args, mod.spec.name, x.kv_scale)),
    }
    for what, (kernel, call) in calls.items():
        call()  # a step packs a kernel's parameters on its first call
        names = gpu_activities(call)
        assert len(names) == 2 and names[0].startswith(f"{kernel}__") and names[1].startswith("lse_combine__"), \
            f"{what}: {names}"
    assert gpu_activities(lambda: mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.op_mask)) == []


def split(total: int, parts: int, most: int, rng: random.Random) -> list[int]:
    """`total` tokens over `parts` requests at random, at most `most` each (zeros allowed)."""
    sizes = [0] * parts
    for _ in range(total):
        sizes[rng.choice([i for i in range(parts) if sizes[i] < most])] += 1
    return sizes


@pytest.mark.parametrize("rescheduled", [False, True], ids=["stale tables", "rescheduled in the graph"])
@pytest.mark.parametrize("spec_name", ["glm5_sm120", "glm5_p16_sm120", "deepseek_v3_sm120", "glm5_static5_sm120",
                                       "glm5_fp8_sm120", "glm5_dsa_fp8_sm120"])
def test_a_graph_of_prepared_layers_replays_with_refilled_metadata(module_for, cuda, seed, spec_name, rescheduled):
    """Three layers' verify calls (and layer 0's prefix and tree calls) of one step in one graph,
    replayed after new lengths, pages, tree shapes (the same token count, split otherwise) and
    masks are copied into the step's metadata tensors and new layer inputs into theirs. Without
    Step.reschedule() the kernels find their work items for themselves (the schedule tables are
    stale); with it, captured first, they read them from the rewritten tables."""
    mod = module_for(spec_name)
    dims = Dims.of(mod.spec)
    rng, g = random.Random(seed), generator(cuda, seed)
    batch_size, max_len, layers = 4, 3000, 3
    total = batch_size * dims.max_nodes if dims.parents else rng.randint(batch_size, batch_size * dims.max_nodes)
    pool = batch_size * math.ceil(max_len / dims.page_size) + 4
    fp8_kv = dims.kv_dtype == "float8_e4m3fn" and dims.scales == "per_tensor"
    scales = [rng.uniform(0.25, 4.0) if fp8_kv else 1.0 for _ in range(layers)]  # kept by the graph, per layer

    def randn(t):
        return torch.randn(t.shape, generator=g, device=cuda, dtype=t.dtype)

    def batch(lens):
        """One batch's inputs for every layer: the same metadata, each layer its own q, cache and keys."""
        sizes = [dims.max_nodes] * batch_size if dims.parents else split(total, batch_size, dims.max_nodes, rng)
        first = make_verify_inputs(replace(dims, kv_dtype="bfloat16"), sizes, lens, tree_kind=rng.choice(TREE_KINDS),
                                   device=cuda, generator=g, num_pages=pool)
        unused = first.kv_cache[:, 0].isnan()
        per_layer = [first] + [replace(first, q=randn(first.q), k_tree=randn(first.k_tree),
                                       kv_cache=randn(first.kv_cache).masked_fill(unused[:, None], float("nan")))
                               for _ in range(layers - 1)]
        return [x.stored_as(dims, s) for x, s in zip(per_layer, scales)]

    captured = batch([rng.randint(0, 64) for _ in range(batch_size)])  # captured with short prefixes
    meta = {name: getattr(captured[0], name).clone() for name in ("qo_indptr", "kv_indptr", "kv_lens", "tree_mask")}
    meta["kv_indices"] = torch.empty(pool, dtype=torch.int32, device=cuda)
    load(meta, captured[0])
    inputs = [{name: getattr(x, name).clone() for name in ("q", "kv_cache", "k_tree")} for x in captured]
    step = mod.prepare(meta["qo_indptr"], meta["kv_indptr"], meta["kv_indices"], meta["kv_lens"],
                       None if dims.parents else meta["tree_mask"])
    outs = [captured[0].outputs() for _ in range(layers + 2)]  # each layer's verify, layer 0's prefix and tree

    def forward():
        if rescheduled:
            step.reschedule()
        for layer, (x, (o, s)) in enumerate(zip(inputs, outs)):
            step.verify(x["q"], x["kv_cache"], x["k_tree"], kv_scale=scales[layer], out=o, lse=s)
        x = inputs[0]
        step.prefix(x["q"], x["kv_cache"], kv_scale=scales[0], out=outs[-2][0], lse=outs[-2][1])
        step.tree(x["q"], x["k_tree"], kv_scale=scales[0], out=outs[-1][0], lse=outs[-1][1])

    graph = capture(forward)

    for replay, lens in enumerate([[max_len] * batch_size, [0, max_len, 1, max_len - 1],
                                   [rng.randint(0, max_len) for _ in range(batch_size)], [0] * batch_size]):
        new = batch(lens)
        load(meta, new[0])
        for buffers, x in zip(inputs, new):
            for name, buf in buffers.items():
                buf.copy_(getattr(x, name))
        for o, s in outs:
            poison_(o)
            poison_(s)
        graph.replay()
        sizes = new[0].qo_indptr.diff().tolist()
        checks = [(f"layer {layer} verify", x.verify_ref) for layer, x in enumerate(new)]
        checks += [("layer 0 prefix", new[0].prefix_ref), ("layer 0 tree", new[0].tree_ref)]
        for (what, ref), (o, s) in zip(checks, outs):
            what = f"{spec_name} replay {replay} T={sizes} L={lens}: {what}"
            assert_all_written(o, f"{what} out")
            assert_all_written(s, f"{what} lse")
            assert_close_attention(o, s, *ref(), **tolerances(mod.spec), what=what)


def test_steps_can_share_one_workspace(module_for, cuda, seed):
    mod = module_for("glm5_sm120")
    g = generator(cuda, seed)
    batches = [make_verify_inputs(mod.spec, sizes, lens, device=cuda, generator=g)
               for sizes, lens in (([16] * 8, [4000, 1, 0, 77, 129, 3000, 64, 65]), ([5, 64], [20000, 300]))]
    need = max(mod.workspace_bytes(x.q.shape[0], x.kv_lens.numel()) for x in batches)
    workspace = torch.empty(need, dtype=torch.uint8, device=cuda)
    steps = [mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask, workspace=workspace)
             for x in batches]
    for _ in range(2):
        for i, (step, x) in enumerate(zip(steps, batches)):
            o, lse = step.verify(x.q, x.kv_cache, x.k_tree)
            assert_close_attention(o, lse, *x.verify_ref(), what=f"step {i} on the shared workspace")


def test_a_step_reads_its_work_items_from_its_schedule_table_while_it_matches_the_lengths(module_for, cuda, seed):
    """A prepared step's kernels take their work items from its schedule tables: items spoiled in a
    current table spoil the call (so the table is what they read), Step.reschedule() mends it, and
    lengths refilled since the table was written make the kernels find their items themselves."""
    from kgen.kernels import VERIFY
    from kgen.splitkv import table_items

    mod = module_for("glm5_sm120")
    g = generator(cuda, seed)
    sizes, pool = [16, 5, 64], 3 * 2100
    first, second = (make_verify_inputs(mod.spec, sizes, lens, device=cuda, generator=g, num_pages=pool)
                     for lens in ([2000, 70, 0], [1999, 2100, 1]))
    meta = {name: getattr(first, name).clone() for name in ("qo_indptr", "kv_indptr", "kv_lens", "tree_mask")}
    meta["kv_indices"] = torch.empty(pool, dtype=torch.int32, device=cuda)
    load(meta, first)
    step = mod.prepare(meta["qo_indptr"], meta["kv_indptr"], meta["kv_indices"], meta["kv_lens"], meta["tree_mask"])
    batch = len(sizes)
    table = step.split_table(VERIFY) - step.workspace.data_ptr()
    items = table + table_items(batch)

    def call(x, what, *, spoiled=False):
        if spoiled:  # every CTA's item: none; and the partial states of the last call gone
            step.workspace[items:items + 16 * step._launches[VERIFY][1]].view(torch.int32).fill_(-1)
            step.workspace[:step.req_meta - step.workspace.data_ptr()].fill_(0xFF)
        o, lse = step.verify(x.q, x.kv_cache, x.k_tree)
        return o, lse, what

    o, lse, what = call(first, "the first call (it writes the table)")
    assert_close_attention(o, lse, *first.verify_ref(), what=what)
    o, lse, _ = call(first, "spoiled", spoiled=True)
    assert o.float().isnan().any() or not torch.allclose(o.float(), first.verify_ref()[0].float(), atol=0.1), \
        "a current table's items are what the kernels run"
    step.reschedule()
    o, lse, what = call(first, "rescheduled")
    assert_close_attention(o, lse, *first.verify_ref(), what=what)
    load(meta, second)
    o, lse, what = call(second, "refilled lengths over a spoiled table", spoiled=True)
    assert_close_attention(o, lse, *second.verify_ref(), what=what)
    step.reschedule()
    o, lse, what = call(second, "refilled and rescheduled")
    assert_close_attention(o, lse, *second.verify_ref(), what=what)


def test_the_device_schedule_hands_out_the_rules_work_items(module_for, cuda, seed):
    """Every attention CTA finds its work item on the device, and CTA 0 writes each request's
    req_meta (first item, splits, stride, row tiles), which the combine reads: it must be the
    schedule's rule (tests/schedule_rule.py) for ragged batches, empty prefixes and long ones, in all
    three calls, equal splits and halving (16 requests of 33 tokens x 16 heads: 144 row tiles on the
    H200's 132 SMs) alike."""
    from schedule_rule import schedule_items

    mod = module_for("glm5_sm120")
    rng, g = random.Random(seed), generator(cuda, seed)
    for _ in range(4):
        batch = rng.choice([1, 3, 8, 31])
        sizes = [rng.randint(1, mod.spec.tree.nodes) for _ in range(batch)]
        lens = [rng.choice([0, 1, rng.randint(2, 5000), rng.randint(5000, 70000)]) for _ in range(batch)]
        x = make_verify_inputs(mod.spec, sizes, lens, device=cuda, generator=g)
        step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.op_mask)
        offset = step.req_meta - step.workspace.data_ptr()
        for call, min_splits, keys in ((lambda: step.verify(x.q, x.kv_cache, x.k_tree), 1, lens),
                                       (lambda: step.prefix(x.q, x.kv_cache), 0, lens),
                                       (lambda: step.tree(x.q, x.k_tree), 1, [0] * batch)):
            step.workspace[offset:offset + 16 * batch].fill_(0xFF)
            call()
            meta = step.workspace[offset:offset + 16 * batch].view(torch.int32).view(batch, 4).cpu()
            _, expect = schedule_items(mod.spec.model.num_q_heads, step.plan.tiles.bm, step.plan.tiles.bn, sizes,
                                       keys, step.target_ctas, min_splits, step.plan.tiles.cluster)
            assert meta.tolist() == [list(m) for m in expect], (sizes, lens, min_splits)
