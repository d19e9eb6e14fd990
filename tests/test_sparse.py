"""Sparse (DSA) verify on the CPU (DESIGN §12): the spec field, the plan of both arches and their
compiled kernels, the float64 reference against a naive per-row computation, the indexer-shaped
test lists, and the host-side checks. (tests/test_sparse_gpu.py runs the kernels.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import kgen
from kgen.build import build
from kgen.cache import KernelCache
from kgen.errors import SpecError
from kgen.occupancy import ctas_by_smem
from kgen.plan import plan
from kgen.render import render
from kgen.sparse import SparseKernels, check_distinct, prefers_union
from kgen.sparse_plan import MAX_TABLE, UNION_MAX_SPLITS, list_capacity
from kgen.sparse_testing import indexer_lists, make_sparse_inputs, prefix_slots
from kgen.spec import parse_spec
from kgen.accuracy import assert_close_attention
from kgen.inputs import Dims

from conftest import spec_named

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "glm5_dsa_sm120.yaml"
DIMS = Dims(num_heads=3, head_dim=64, value_dim=48, scale=0.2, max_nodes=40, page_size=4)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- spec and plan ----------------------------------------------------------------------------

def spec_data(**model) -> dict:
    import yaml

    data = yaml.safe_load(SPEC.read_text())
    data["model"].update(model)
    return data


def test_index_topk_makes_a_sparse_spec_and_is_checked():
    assert kgen.load_spec(SPEC).model.index_topk == 2048 and kgen.load_spec(SPEC).model.sparse
    dense = spec_data()
    del dense["model"]["index_topk"]
    assert not parse_spec(dense).model.sparse
    for bad, words in ((0, "greater than or equal to 1"), (1 << 17, "less than or equal to 65536"),
                       (True, "valid integer"), ("2048", "valid integer")):
        with pytest.raises(SpecError, match=f"bad.yaml: model.index_topk = .*{words}"):
            parse_spec(spec_data(index_topk=bad), "bad.yaml")


# The hash set's entries: the largest power of two whose set (8 B an entry + 136 B) fits the KV ring
# and leaves the warps' insertion queues (4 B an entry, at least 16 x 32 a warp) room before the
# barriers: each plan's ring of 4 stages x 32 rows holds MAX_TABLE.
TABLES = {("glm5_dsa_sm120", "sm_120"): MAX_TABLE, ("glm5_dsa_sm120", "sm_90"): MAX_TABLE,
          ("glm5_dsa_bf16_sm120", "sm_120"): MAX_TABLE, ("glm5_dsa_bf16_sm120", "sm_90"): MAX_TABLE}
# The sparse tiles (BM, WARPS_M, CTAs an SM): 16-row tiles, one row block (kgen/sparse_plan.py
# row_block_tiles), two CTAs an SM on sm_90 (its 228 KB hold two), one on sm_120 (100 KB).
SPARSE_TILES = {"sm_90": (16, 1, 2), "sm_120": (16, 1, 1)}


@pytest.mark.parametrize("name, arch", list(TABLES))
def test_both_plans_have_the_sparse_kernels_on_the_mma_sync_loop(name, arch):
    p = plan(spec_named(name), arch)
    sparse = {v.name: v for v in p.variants if v.kernel == "sparse_attn"}
    assert set(sparse) == {"sparse_verify_attn", "sparse_gather_attn"}
    bm, warps_m, ctas = SPARSE_TILES[arch]
    for v in sparse.values():
        assert f"kgen::AttnConfig<8, 576, 512, {bm}, 32, {warps_m}, 4," in v.constants["CONFIG"], v.constants["CONFIG"]
        assert v.min_blocks == ctas and v.threads == 32 * (4 * warps_m + 1)
        assert v.smem_bytes <= p.arch.smem_per_block
        assert ctas_by_smem(p.arch, v.smem_bytes) >= ctas  # the driver's reservation and 128-B units included
        table = v.constants["TABLE"]
        assert table == TABLES[name, arch] and table * 8 + 136 <= v.smem_bytes  # the hash set fits inside the ring
        bar_off = int(v.constants["CONFIG"].split("BAR_OFF = ")[1].split(";")[0])
        assert table * 8 + 136 + v.threads * 4 * 16 <= bar_off  # and its queues before the barriers
        # Q's tile apart from the ring (its copies overlap the key list's build) where shared memory allows
        apart = "static constexpr int Q_OFF = 0;" not in v.constants["CONFIG"]
        assert apart == (arch == "sm_90"), v.constants["CONFIG"]
        # a CTA's key list holds its row tile's entries (BM / 8 tokens of 8 heads x index_topk): what
        # bounds its distinct slots, whatever the rounds its union takes
        assert v.constants["LIST_KEYS"] == bm // 8 * 2048
    assert sparse["sparse_verify_attn"].constants["UNION"] and not sparse["sparse_gather_attn"].constants["UNION"]
    assert p.variant("sparse_combine").constants["BM"] == bm  # the sparse tiles', whatever the dense design
    assert not [v for v in plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"), arch).variants
                if v.name.startswith("sparse")]


def test_a_step_picks_the_union_kernel_unless_a_2_token_tile_gets_many_splits():
    """prepare_sparse(union=None): gather where row tiles of <= 2 tokens get more splits a wave than
    UNION_MAX_SPLITS allows for the CTAs an SM holds (6 with two, 12 with one: B <= 5 at T16 on 132
    SMs two CTAs each, B1 T <= 20 on 132 SMs one CTA each), else the union."""
    from types import SimpleNamespace

    spec = spec_named("glm5_dsa_sm120")

    def kernels(bm, target, ctas=2):
        return SimpleNamespace(spec=spec, bm=bm, target=target, ctas_per_sm=ctas)

    two_cta = kernels(16, 2 * 132)  # the sm_90 plan's 16-row tiles: 2 tokens of 8 heads
    assert [prefers_union(two_cta, 16 * b) for b in (1, 2, 4, 6, 8, 32)] == [False, False, False, True, True, True]
    assert not prefers_union(two_cta, 64)  # one request of 64 tokens: 32 row tiles, 8.25 splits each
    assert prefers_union(two_cta, 88)  # 44 row tiles, 6 splits each
    assert not prefers_union(two_cta, 1)  # decode: one token's list, no union to take
    row_tiles = 16 * 8 // 16
    assert prefers_union(kernels(16, UNION_MAX_SPLITS[2] * row_tiles), 16)
    assert not prefers_union(kernels(16, UNION_MAX_SPLITS[2] * row_tiles + 1), 16)
    one_cta = kernels(16, 132, ctas=1)  # the sm_120 plan's, 132 SMs
    # T16: 8 row tiles, 16.5 splits each; T24: 12, 11 (the union); B2 T16: 16 row tiles, 8.25
    assert [prefers_union(one_cta, n) for n in (1, 16, 20, 24, 32)] == [False, False, False, True, True]
    assert all(prefers_union(kernels(32, 188, ctas=1), n) for n in (1, 16, 64))  # 4-token tiles: always


def test_one_request_s_tree_is_a_split_of_its_own_where_the_wave_has_room():
    """A one-request step gives each row tile's tree a split of its own where R (S + 1) items fit the
    wave (bench/NOTES.md v112), by the schedule's split rule; a batch, or a request whose splits fill
    the wave, keeps the tree on the last split."""
    from test_step import stub_module

    from kgen.sparse_plan import MIN_CHUNK

    mod = stub_module("glm5_dsa_sm120", sm_count=132)  # the sm_120 plan: 16-row tiles of 2 tokens, one CTA an SM
    k = mod._sparse_kernels()
    assert (k.bm, k.target) == (16, 132)

    def step(sizes, width=2048):
        x = make_sparse_inputs(mod.spec, sizes, [5000] * len(sizes), width, generator=gen(0))
        return mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask)

    # T8: 4 row tiles of 2 tokens' 4,096 entries; chunk = 16,384 / 128 = 128 -> 32 splits; 4 x 33 = 132 fits
    assert step([8]).tree_apart
    # T16: 8 row tiles; chunk = ceil(32,768 / 124) = 265 -> 16 splits; 8 x 17 = 136 does not
    assert not step([16]).tree_apart
    # T1: one row tile of 2,048 entries; chunk = max(MIN_CHUNK, 2048 / 131) = 64 -> 32 splits
    assert MIN_CHUNK == 64 and step([1]).tree_apart
    assert not step([1, 1]).tree_apart  # a batch: no room is reserved for it
    assert step([16], width=333).tree_apart  # K' = 333: 8 x (ceil(666 / 64) + 1) = 96


def test_a_default_step_and_its_workspace_follow_the_choice(seed):
    from test_step import stub_module

    mod = stub_module("glm5_dsa_sm120", sm_count=132)  # the sm_120 plan: 2-token tiles, one CTA an SM
    for tokens, union in ((16, False), (64, True)):  # 8 row tiles: 16.5 splits each, the gather; 32: 4.1, the union
        x = make_sparse_inputs(mod.spec, [tokens], [4000], 2048, generator=gen(seed))
        b = x.base
        step = mod.prepare_sparse(b.qo_indptr, x.topk_indices, b.op_mask)
        assert step.union == union and step.workspace.numel() == mod.sparse_workspace_bytes(tokens, 1, union=union)
    # a workspace for either kernel, as a server sizes one for all its graph steps
    assert mod.sparse_workspace_bytes(16, 1) == max(mod.sparse_workspace_bytes(16, 1, union=u) for u in (True, False))


def test_only_the_union_kernels_workspace_holds_key_lists():
    """The gather kernel reads its split's list entries in place (bench/NOTES.md v99): its workspace
    has no key-list region, the union's one of LIST_KEYS slots and masks a CTA."""
    from test_step import stub_module

    from kgen.sparse import sparse_workspace_layout

    k = stub_module("glm5_dsa_sm120", sm_count=132)._sparse_kernels()
    for grid, batch in ((300, 1), (1001, 64)):
        _, _, lists, table, size = sparse_workspace_layout(k, grid, batch, union=False)
        _, _, u_lists, u_table, u_size = sparse_workspace_layout(k, grid, batch, union=True)
        assert lists == u_lists and table == lists
        assert u_table - u_lists >= grid * 2 * k.list_keys * 4 and u_size - size == u_table - table


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
@pytest.mark.parametrize("kv", ["bfloat16", "float8_e4m3fn", "per_block"])
def test_the_sparse_kernels_compile_without_spills_and_use_the_tensor_cores(arch, kv, tmp_path_factory):
    data = spec_data()
    data["cache"].update({"kv_dtype": "float8_e4m3fn", "scales": "per_block"} if kv == "per_block"
                         else {"kv_dtype": kv, "scales": None})
    data["name"] = f"dsa_{kv[:4]}"
    p = plan(parse_spec(data), arch)
    built = build(p.__class__(p.spec, p.arch, p.tiles, tuple(v for v in p.variants if v.name.startswith("sparse")),
                              p.budget), [arch], KernelCache(tmp_path_factory.mktemp("cache")), inspect=True)
    assert [b.variant.name for b in built] == ["sparse_verify_attn", "sparse_gather_attn", "sparse_schedule", "sparse_combine"]
    for b in built:
        assert b.problems() == [], (b.variant.name, b.problems())  # no spills or local memory; MMAs fed by bulk copies
        if arch == "sm_120":
            assert b.smem_bytes <= 99 * 1024


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
def test_the_sparse_partial_states_hold_o_in_bf16(arch):
    """The sparse kernels write their partial o as bf16 and the combine reads it so (half the bytes of
    fp32: bench/NOTES.md v50); the workspace holds grid x BM rows of it, then the fp32 lse."""
    from types import SimpleNamespace

    from kgen.sparse import sparse_workspace_layout

    p = plan(spec_named("glm5_dsa_sm120"), arch)
    for name in ("sparse_verify_attn", "sparse_gather_attn", "sparse_combine"):
        (ctype,) = [x.ctype for x in p.variant(name).params if x.name == "part_o"]
        assert ctype.replace("const ", "").startswith("__nv_bfloat16*"), (name, ctype)
    (dense_ctype,) = [x.ctype for x in p.variant("lse_combine").params if x.name == "part_o"]
    assert "float*" in dense_ctype  # the dense path's partials stay fp32
    grid, batch = 200, 3
    off_lse, *_ = sparse_workspace_layout(SimpleNamespace(spec=p.spec, bm=32, list_keys=8192), grid, batch,
                                           union=True)
    assert grid * 32 * 512 * 2 <= off_lse < grid * 32 * 512 * 2 + 1024


def test_list_capacity_is_half_the_set():
    assert list_capacity(8192) == 4096


# ---- reference --------------------------------------------------------------------------------

def naive_sparse(x):
    """One softmax per (row, head) over an explicit list of keys: row i's listed slots in list
    order (each a cache row), then its visible tree tokens from the raw mask bits."""
    b = x.base
    q, cache, k_tree = b.q.double(), b.kv_cache.double() * b.kv_scale, b.ref_k_tree.double()
    qo, words, lists = b.qo_indptr.tolist(), b.tree_mask.tolist(), x.topk_indices.tolist()
    o = torch.zeros(q.shape[0], q.shape[1], b.value_dim, dtype=torch.float64)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    for r in range(len(qo) - 1):
        for i in range(qo[r], qo[r + 1]):
            keys = [cache[s] for s in lists[i] if s >= 0]
            keys += [k_tree[qo[r] + j] for j in range(qo[r + 1] - qo[r]) if (words[i][j // 32] >> (j % 32)) & 1]
            if not keys:
                continue
            k = torch.stack(keys)
            for h in range(q.shape[1]):
                logits = b.scale * (k @ q[i, h])
                lse[i, h] = torch.logsumexp(logits, 0)
                o[i, h] = torch.softmax(logits, 0) @ k[:, :b.value_dim]
    return o, lse


@pytest.mark.parametrize("shared, holes, foreign", [(0.9, 0.0, 0.0), (0.0, 0.1, 0.0), (0.5, 0.2, 0.3)])
def test_sparse_reference_matches_naive_per_row_softmax(seed, shared, holes, foreign):
    x = make_sparse_inputs(DIMS, [5, 0, 12, 1], [60, 30, 90, 7], 16, shared=shared, holes=holes, foreign=foreign,
                           window=5, tree_kind="bits", generator=gen(seed))
    o, lse = x.ref()
    o_n, lse_n = naive_sparse(x)
    torch.testing.assert_close(o, o_n, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse_n, rtol=1e-12, atol=1e-12)


def test_lists_of_the_whole_prefix_give_dense_verify(seed):
    """L <= K': every prefix token listed (in any order, -1 after) is the dense verify."""
    x = make_sparse_inputs(DIMS, [4, 7, 1, 0], [16, 0, 9, 3], 16, generator=gen(seed))
    assert_close_attention(*x.ref(), *x.base.verify_ref(), o_tol=1e-12, lse_tol=1e-12)


def test_rows_that_list_nothing_and_see_nothing_are_empty_and_fp8_means_dequantized(seed):
    x = make_sparse_inputs(Dims(**{**DIMS.__dict__, "kv_dtype": "float8_e4m3fn"}), [3, 4], [30, 40], 8,
                           tree_kind="bits", generator=gen(seed))
    x.topk_indices[1] = -1
    x.base.tree_mask[1] = 0
    o, lse = x.ref()
    assert torch.isinf(lse[1]).all() and (o[1] == 0).all() and torch.isfinite(lse[[0, 2, 3]]).all()
    torch.testing.assert_close(o, naive_sparse(x)[0], rtol=1e-12, atol=1e-12)


def test_the_order_of_a_list_does_not_matter(seed):
    x = make_sparse_inputs(DIMS, [6, 3], [50, 70], 12, holes=0.2, generator=gen(seed))
    o, lse = x.ref()
    perm = torch.randperm(12, generator=gen(seed + 1))
    x.topk_indices = x.topk_indices[:, perm].contiguous()
    o2, lse2 = x.ref()
    torch.testing.assert_close(o, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse2, rtol=1e-12, atol=1e-12)


# ---- test lists -------------------------------------------------------------------------------

def test_indexer_lists_share_sinks_window_and_common_picks(seed):
    slots = torch.randperm(10000, generator=gen(seed))[:5000]
    rows = indexer_lists(slots, 16, 256, shared=0.75, window=32, generator=gen(seed))
    assert rows.shape == (16, 256)
    for r in rows:
        assert torch.unique(r).numel() == 256 and torch.isin(r, slots).all()
    shared = set(rows[0].tolist()).intersection(*(set(r.tolist()) for r in rows[1:]))
    assert len(shared) == 192  # round(0.75 * 256): own picks never repeat a shared one
    assert set(slots[:4].tolist()) <= shared and set(slots[-32:].tolist()) <= shared
    assert 192 + 64 < torch.unique(rows).numel() <= 192 + 16 * 64  # own picks differ between tokens (mostly)


def test_short_prefixes_are_listed_whole_and_padded_with_minus_one(seed):
    slots = torch.tensor([7, 3, 11])
    rows = indexer_lists(slots, 2, 5, shared=0.5, window=1, generator=gen(seed))
    for r in rows.tolist():
        assert sorted(r) == [-1, -1, 3, 7, 11]


def test_test_lists_stay_distinct_with_holes_and_foreign_slots(seed):
    x = make_sparse_inputs(DIMS, [8, 8, 8], [200, 150, 300], 32, shared=0.3, holes=0.2, foreign=0.5, window=4,
                           generator=gen(seed))
    check_distinct(x.topk_indices)
    qo = x.base.qo_indptr.tolist()
    crossed = 0
    for b in range(3):
        mine = set(prefix_slots(x.base, b).tolist())
        rows = x.topk_indices[qo[b]:qo[b + 1]]
        listed = set(rows[rows >= 0].tolist())
        crossed += len(listed - mine)
    assert crossed > 0 and (x.topk_indices == -1).any()
    assert not torch.isnan(x.base.kv_cache[x.topk_indices[x.topk_indices >= 0].long()]).any()  # only used slots


def test_check_distinct_names_the_first_row_with_a_repeat():
    rows = torch.tensor([[3, -1, -1, 5], [1, 2, 9, 2], [4, 4, 0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_indices: row 1 lists a slot more than once"):
        check_distinct(rows)
    check_distinct(rows[:1])  # -1 may repeat
    check_distinct(torch.zeros(3, 1, dtype=torch.int32))


def test_union_sizes_count_distinct_slots_per_request(seed):
    x = make_sparse_inputs(DIMS, [4, 2], [100, 100], 16, shared=1.0, generator=gen(seed))
    assert x.union_sizes() == [16, 16]  # every token of a request lists the same 16
    y = make_sparse_inputs(DIMS, [4], [1000], 16, shared=0.0, holes=0.3, generator=gen(seed))
    assert y.union_sizes() == [len({s for row in y.topk_indices.tolist() for s in row if s >= 0})]


def test_tile_rows_count_each_row_tiles_distinct_and_listed_slots(seed):
    x = make_sparse_inputs(DIMS, [4, 3], [1000, 1000], 16, shared=0.5, holes=0.2, generator=gen(seed))
    heads = DIMS.num_heads  # 3
    tiles = {2 * heads: [[0, 1], [2, 3], [4, 5], [6]],  # 2 tokens a tile; request 1's last tile 1 token
             4: [[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6]]}  # 4 rows: tokens straddle tiles
    for bm, tokens in tiles.items():
        listed = [[v for i in tile for v in x.topk_indices[i].tolist() if v >= 0] for tile in tokens]
        assert x.tile_rows(heads, bm) == (sum(len(set(ls)) for ls in listed), sum(map(len, listed))), bm
    one = make_sparse_inputs(DIMS, [2], [1000], 16, shared=1.0, generator=gen(seed))
    assert one.tile_rows(heads, 2 * heads) == (16, 32)  # two tokens listing the same 16: the gather reads them twice


def test_the_custom_op_has_a_fake_implementation():
    from kgen import library

    spec = kgen.load_spec(SPEC)
    library.register_spec(spec)

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="meta")

    o, lse = torch.ops.kgen.sparse_verify_attention(meta(16, 8, 576), meta(1000, 576), meta(16, 576),
                                                    meta(2, dtype=torch.int32), meta(16, 2048, dtype=torch.int32),
                                                    meta(16, 2, dtype=torch.int32), spec.name)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((16, 8, 512), torch.bfloat16, (16, 8), torch.float32)


def test_kgen_show_models_the_sparse_shapes_on_sm120():
    import json

    from typer.testing import CliRunner

    from kgen.cli import app

    text = CliRunner().invoke(app, ["show", str(SPEC)], env={"COLUMNS": "100"})
    assert text.exit_code == 0, text.output
    assert "sparse_verify_attn (each row tile's union" in text.output and "8192-entry hash set" in text.output
    result = CliRunner().invoke(app, ["show", str(SPEC), "--json"])
    assert result.exit_code == 0, result.output
    main = json.loads(result.output)["sparse"][0]
    assert (main["B"], main["L"], main["T"], main["shared"]) == (1, 131072, 16, 0.7)
    shared = round(0.7 * 2048)
    union = shared + 16 * (2048 - shared)  # the main shape: B=1, L=131072, T=16, K=2048
    assert main["union_rows"] == union
    floor_us = (union + 16) * 656 / 1792e9 * 1e6  # union rows (and the tree) of 656 B once at sm_120's 1.79 TB/s
    assert main["floor_us"] == pytest.approx(floor_us, abs=0.05)
    assert main["model_us"] > main["floor_us"]  # the model never beats its floor


# ---- the sparse step's launches, on the CPU (stand-in kernels decode each launch's arguments) ----

def test_a_sparse_call_is_two_launches_with_the_arguments_the_kernels_declare(seed):
    """A prepared step's first call writes its schedule table first (sparse_schedule, one CTA per
    attention CTA), every call is then two launches; reschedule() writes the table again; a one-shot
    call keeps none."""
    from test_step import ptr, stub_module

    from kgen.kernels import SPARSE_COMBINE
    from kgen.sparse import UNBOUNDED, sparse_workspace_layout
    from kgen.splitkv import table_bytes

    mod = stub_module("glm5_dsa_bf16_sm120", sm_count=132)
    x = make_sparse_inputs(mod.spec, [5, 16, 0, 2], [300, 4000, 10, 0], 512, holes=0.1, generator=gen(seed))
    b = x.base
    out, lse = b.outputs()
    for union in (True, False):
        mod.launches.clear()
        step = mod.prepare_sparse(b.qo_indptr, x.topk_indices, b.op_mask, union=union)
        step.verify(b.q, b.kv_cache, b.k_tree, out=out, lse=lse)
        name = "sparse_verify_attn" if union else "sparse_gather_attn"
        assert [name for name, *_ in mod.launches] == ["sparse_schedule", name, "sparse_combine"]
        writes, calls = mod.launches[:1], mod.launches[1:]
        mod.launches.clear()
        step.verify(b.q, b.kv_cache, b.k_tree, out=out, lse=lse)
        assert mod.launches == calls  # the table is written once
        mod.launches.clear()
        step.reschedule()
        assert mod.launches == writes
        (_, grid, _, attn, _), (_, combine_grid, _, combine, combine_threads) = calls
        tokens, batch, heads = b.q.shape[0], 4, mod.spec.model.num_q_heads
        row_tiles = -(-tokens * heads // 16) + batch  # the rule: one wave plus a CTA per row tile a request starts
        cap = 4096
        assert grid == (132 + row_tiles if union else 132 + row_tiles * -(-min(16, 64) * 2048 // cap))
        assert combine_grid == tokens * heads
        assert combine_threads == SPARSE_COMBINE.threads(512, tokens * heads, grid, 32, batch, 132)
        base = step.workspace.data_ptr()
        off_lse, off_meta, off_lists, off_table, size = sparse_workspace_layout(mod._sparse, grid, batch, union)
        assert step.workspace.numel() == size and off_lists - off_meta >= batch * 16
        # the union's CTAs a list each: LIST_KEYS slots and masks; the gather reads its entries in place
        assert off_table - off_lists >= grid * 2 * (2 * 2048) * 4 if union else off_table == off_lists
        assert size - off_table >= table_bytes(grid, batch)
        rule = dict(qo_indptr=ptr(b.qo_indptr), topk_width=512, batch=batch, target_ctas=132, min_chunk=64,
                    max_chunk=UNBOUNDED if union else cap, max_nodes=64, total_tokens=tokens,
                    tree_apart=0)  # a batch: the trees ride on their last splits
        [(_, schedule_grid, _, schedule, _)] = writes
        table = base + off_table
        assert schedule_grid == grid and schedule == dict(**rule, table=table)
        assert attn == dict(q=ptr(b.q), kv_cache=ptr(b.kv_cache), kv_scale=1.0, k_tree=ptr(b.k_tree),
                            tree_mask=ptr(b.tree_mask), topk_indices=ptr(x.topk_indices), **rule, validate=0,
                            error_flag=ptr(mod.state.error_flag), req_meta=base + off_meta, part_o=base,
                            part_lse=base + off_lse, lists=base + off_lists, num_slots=b.kv_cache.shape[0],
                            schedule_table=table)
        assert combine == dict(part_o=base, part_lse=base + off_lse, qo_indptr=ptr(b.qo_indptr),
                               req_meta=base + off_meta, batch=batch, o=ptr(out), lse=ptr(lse))
    mod.launches.clear()
    mod.sparse_verify_attention(b.q, b.kv_cache, b.k_tree, b.qo_indptr, x.topk_indices, b.op_mask, out=out, lse=lse)
    # by size (prefers_union): 12 row tiles of 2 tokens, 11 splits each in a wave of 132 CTAs one an SM: the union
    assert [name for name, *_ in mod.launches] == ["sparse_verify_attn", "sparse_combine"]
    assert mod.launches[0][3]["schedule_table"] == 0  # one call: its CTAs find their items


def test_the_sparse_kernels_read_a_schedule_table_where_their_plan_builds_them_so():
    """Every sparse kernel takes its items from a step's table but the sm_120 plan's over fp8 rows with
    one scale, whose read spilled them (kgen/sparse_plan.py NO_TABLE); a kernel built without it is
    passed none."""
    for kv, scales, sm120 in (("bfloat16", None, (True, True)), ("float8_e4m3fn", "per_tensor", (False, False)),
                              ("float8_e4m3fn", "per_block", (True, True))):
        data = spec_data()
        data["cache"].update({"kv_dtype": kv, "scales": scales})
        for arch in ("sm_120", "sm_90"):
            p = plan(parse_spec(data), arch)
            reads = tuple(p.variant(n).constants["SCHEDULE_TABLE"] for n in ("sparse_verify_attn", "sparse_gather_attn"))
            assert reads == (sm120 if arch == "sm_120" else (True, True)), (kv, scales, arch)
            for name, read in zip(("sparse_verify_attn", "sparse_gather_attn"), reads):
                assert ("schedule_table," in render(p.variant(name))) == read


def test_validate_mode_sparse_steps_keep_no_schedule_table(seed, monkeypatch):
    """Under KGEN_VALIDATE=1 the kernels find their items themselves (that is where the lengths are
    checked): no table, no sparse_schedule launch, reschedule() launches nothing."""
    from test_step import stub_module

    monkeypatch.setenv("KGEN_VALIDATE", "1")
    mod = stub_module("glm5_dsa_bf16_sm120")
    x = make_sparse_inputs(mod.spec, [4, 2], [300, 9], 64, generator=gen(seed))
    step = mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask)
    step.reschedule()
    assert mod.launches == [] and step.schedule_table == 0


def test_a_step_whose_key_lists_outgrow_32_bit_indices_is_refused(seed):
    from test_step import stub_module

    mod = stub_module("glm5_dsa_bf16_sm120", sm_count=(1 << 32) // (2 * 2 * 2048))  # one wave of CTAs fills 2^32
    x = make_sparse_inputs(mod.spec, [4], [300], 64, generator=gen(seed))
    with pytest.raises(ValueError, match="exceed the 2\\^32 entries"):
        mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=True)
    assert mod.launches == []


def test_the_union_refuses_a_cache_whose_slots_its_insertion_queue_cannot_hold(seed):
    """The union queues an entry as its slot with its token in the top bits: both plans' 16-row tiles
    hold 2 tokens (1 bit), so their caches stop at int32's 2^31 rows (4-token tiles would stop at
    2^30). A larger cache is refused before any launch; the gather reads it."""
    from test_step import RecordingKernel, stub_module

    mod = stub_module("glm5_dsa_bf16_sm120")
    assert mod._sparse.union_slots == 1 << 31
    sm90 = {v.name: RecordingKernel(v, []) for v in plan(mod.spec, "sm_90").variants}
    assert SparseKernels(mod.spec, sm90, 132).union_slots == 1 << 31
    x = make_sparse_inputs(mod.spec, [4], [300], 64, generator=gen(seed))
    q, cache, k_tree, qo, topk, mask = x.args()
    mod._sparse.union_slots = cache.shape[0] - 1  # as if the cache had one row more than 2^30
    union, gather = (mod.prepare_sparse(qo, topk, mask, union=u) for u in (True, False))
    mod.launches.clear()
    with pytest.raises(ValueError, match=f"kv_cache: {cache.shape[0]} rows exceed the {cache.shape[0] - 1} the union"):
        union.verify(q, cache, k_tree)
    assert mod.launches == []
    gather.verify(q, cache, k_tree)
    assert [name for name, *_ in mod.launches][-2:] == ["sparse_gather_attn", "sparse_combine"]


def test_sparse_arguments_are_checked_before_any_launch(seed):
    from test_step import stub_module

    mod = stub_module("glm5_dsa_bf16_sm120")
    x = make_sparse_inputs(mod.spec, [4], [300], 64, generator=gen(seed))
    q, cache, k_tree, qo, topk, mask = x.args()
    cases = [
        (TypeError, "topk_indices: expected dtype torch.int32", lambda: mod.prepare_sparse(qo, topk.long(), mask)),
        (ValueError, "index_topk 2048", lambda: mod.prepare_sparse(qo, torch.zeros(4, 2049, dtype=torch.int32), mask)),
        (ValueError, "tree_mask: expected size 4 in dim 0", lambda: mod.prepare_sparse(qo, topk, mask[:3])),
        (ValueError, "tree_mask: 1 int32 words per row are narrower", lambda: mod.prepare_sparse(qo, topk, mask[:, :1])),
        (ValueError, "q: expected size 4 in dim 0",
         lambda: mod.sparse_verify_attention(q[:3], cache, k_tree, qo, topk, mask)),
        (ValueError, "kv_scale", lambda: mod.sparse_verify_attention(q, cache, k_tree, qo, topk, mask, kv_scale=2.0)),
        (TypeError, "kv_cache: expected dtype torch.bfloat16",
         lambda: mod.sparse_verify_attention(q, cache.float(), k_tree, qo, topk, mask)),
    ]
    for error, words, call in cases:
        mod.launches.clear()
        with pytest.raises(error, match=words):
            call()
        assert mod.launches == []
    dense = stub_module("glm5_sm120")
    with pytest.raises(ValueError, match="glm5_sm120 has no model.index_topk"):
        dense.prepare_sparse(qo, topk, mask)


def test_a_sparse_step_reads_the_dsa_pools_rows(seed):
    """cache.scales per_block: kv_cache is uint8 [slots, 656] (the DSA pool's rows), bf16 tree keys
    are quantized to such rows by the pool's rule before the launch (stored uint8 rows pass as they
    are), and kv_scale is refused (the rows carry their own scales)."""
    from test_step import ptr, stub_module

    from kgen.fp8 import quantize_rows

    mod = stub_module("glm5_dsa_sm120")
    x = make_sparse_inputs(mod.spec, [5, 3], [300, 70], 128, generator=gen(seed))
    b = x.base
    assert b.kv_cache.dtype == torch.uint8 and b.kv_cache.shape[1] == 656
    step = mod.prepare_sparse(b.qo_indptr, x.topk_indices, b.op_mask, union=True)
    for k_tree, quantized in ((b.k_tree, True), (quantize_rows(b.k_tree, 512), False)):
        mod.launches.clear()
        step.verify(b.q, b.kv_cache, k_tree)
        (attn,) = [args for name, _, _, args, _ in mod.launches if name == "sparse_verify_attn"]
        assert attn["kv_cache"] == ptr(b.kv_cache)
        assert attn["num_slots"] == b.kv_cache.shape[0] and attn["kv_scale"] == 1.0
        assert (attn["k_tree"] != ptr(k_tree)) == quantized
    with pytest.raises(ValueError, match="carry their own block scales"):
        step.verify(b.q, b.kv_cache, b.k_tree, kv_scale=2.0)
    with pytest.raises(ValueError, match="kv_cache: expected size 656 in dim 1"):
        step.verify(b.q, b.kv_cache[:, :576].contiguous(), b.k_tree)
