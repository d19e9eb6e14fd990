"""The performance model (kgen/model.py) for sparse verify (templates/sparse_attention.cuh).

A sparse call is the mma.sync tile loop over each work item's key list: the items of the sparse
schedule (find_sparse_item) for B identical requests whose lists share round(shared * K) slots and
pick the rest on their own (kgen.sparse_testing's indexer shape), so a row tile of n tokens reads
shared + n * own keys and a request's union is shared + T * own. The row tiles of a split read
their slices side by side, so DRAM sees each union row once. Each union item first builds its list
(scans its tokens' entries from L2); that build is added to the item's startup. Where the step runs
the per-token gather (kgen/sparse.py prefers_union), an item's keys are its share of the row tile's
entries, one a (token, key), and it builds nothing. A MODEL, not a measurement: the tile loop and the
calibration are the dense path's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .arch import Arch, get_arch
from . import kvrows
from .model import Call, Floor, Item, Prediction, Shape, calibration, combine_shape, tile_work
from .plan import plan
from .sparse_plan import (PART_O_BYTES, UNBOUNDED, list_capacity, request_splits, sparse_tiles, tile_tokens, tree_apart,
                          union_by_size)
from .splitkv import ceil_div
from .variant import PlanContext
from .spec import Spec

L2_BYTES_PER_CLK = 64  # list entries an SM reads from L2 per cycle (an assumption, not fitted)


@dataclass(frozen=True)
class SparseShape:
    shape: Shape  # H, T, L, B, page size
    shared: float  # fraction of K every token of a request lists

    def label(self) -> str:
        s = self.shape
        return f"B={s.B} L={s.L} T={s.T} shared={self.shared:.0%}"


def unions(spec: Spec, s: SparseShape, tokens: int) -> int:
    """Distinct slots `tokens` tokens of one request list (own picks assumed distinct)."""
    k = min(spec.model.index_topk, s.shape.L)
    shared = k if s.shape.L <= spec.model.index_topk else round(s.shared * k)
    return min(s.shape.L, shared + tokens * (k - shared))


def sparse_floor(spec: Spec, s: SparseShape, arch: Arch) -> Floor:
    """DESIGN §12: the union rows once, or the FLOPs of the listed keys (and the tree), whichever is larger."""
    m, sh = spec.model, s.shape
    nbytes = sh.B * (unions(spec, s, sh.T) + sh.T) * kvrows.row_bytes(spec)
    flops = 2 * sh.B * sh.T * sh.H * (min(m.index_topk, sh.L) + sh.T) * (m.head_dim + m.value_dim)
    rate = arch.mma_fp8_tflops if spec.cache.mma_type == "e4m3" and arch.mma_fp8_tflops else arch.mma_bf16_tflops
    return Floor(nbytes, flops, nbytes / (arch.dram_gbps * 1e9) * 1e6, flops / (rate * 1e12) * 1e6)


def predict_sparse(spec: Spec, s: SparseShape, arch: str | Arch, *, plan_for: str | None = None) -> Prediction:
    """Modeled time of one sparse_verify_attention call of `s` on `arch` with the plan for `plan_for`,
    on the kernel the step picks by size (the union or the per-token gather)."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    base = plan(spec, plan_for)
    p = plan(spec, base.arch, sparse_tiles(PlanContext(spec, base.arch, base.tiles, "")))
    sh, bm, bn = s.shape, p.tiles.bm, p.tiles.bn
    heads = spec.model.num_q_heads
    tokens = min(sh.T, tile_tokens(heads, bm))
    entries = tokens * spec.model.index_topk
    target = arch.sm_count * p.tiles.min_blocks
    # the kernel a step runs by size (kgen/sparse.py prefers_union): the union's split lists its share of
    # the row tile's union, the gather's reads its share of the tile's entries, one key each, no list
    union = union_by_size(heads, bm, sh.B * sh.T, target, p.tiles.min_blocks)
    max_chunk = UNBOUNDED if union else list_capacity(p.variant("sparse_verify_attn").constants["TABLE"])
    row_tiles, splits = request_splits(heads, bm, sh.T, spec.model.index_topk, target, max_chunk, sh.B)
    keys = (unions(spec, s, tokens) if union else entries) / splits  # a row tile's share of its split
    request_bytes = unions(spec, s, sh.T) / splits * kvrows.row_bytes(spec)
    tree_tiles = ceil_div(sh.T, bn)
    apart = tree_apart(sh.B, row_tiles, splits, target)  # then the tree is one more split
    items = []
    for split in range(splits):
        tiles = max(1, ceil_div(round(keys), bn) + (tree_tiles if split == splits - 1 and not apart else 0))
        items += [Item(tiles, request_bytes / row_tiles / tiles)] * row_tiles
    if apart:
        items += [Item(tree_tiles, 0.0)] * row_tiles  # the tree's rows come from k_tree, not the cache
        splits += 1
    work = tile_work(p, arch)
    all_items = tuple(items * sh.B)
    call = Call(spec, sh, arch, p, work, all_items, splits, *combine_shape(p, sh, arch, len(all_items), splits),
                part_o_bytes=PART_O_BYTES, paged_keys=False)
    cal = calibration()
    build_us = entries * 4 / (L2_BYTES_PER_CLK * arch.clock_ghz * 1e3) if union else 0.0
    prediction = call.predict(replace(cal, startup_us=cal.startup_us + build_us))
    return replace(prediction, floor=sparse_floor(spec, s, arch))


# The shapes `kgen show` models for a sparse spec: the main shape first.
def show_shapes(spec: Spec) -> list[SparseShape]:
    h, p = spec.model.num_q_heads, spec.cache.page_size
    t = min(16, spec.tree.nodes)
    return [SparseShape(Shape(h, t, 131072, 1, p), 0.7), SparseShape(Shape(h, t, 131072, 8, p), 0.7),
            SparseShape(Shape(h, t, 32768, 32, p), 0.7), SparseShape(Shape(h, 1, 131072, 1, p), 0.7),
            SparseShape(Shape(h, min(64, spec.tree.nodes), 131072, 1, p), 0.5),
            SparseShape(Shape(h, t, 131072, 1, p), 0.0)]
