"""The performance model (kgen/model.py) for sparse verify (templates/sparse_attention.cuh).

A sparse call is the mma.sync tile loop over each work item's key list: the items of the sparse
schedule (find_sparse_item) for B identical requests whose lists share round(shared * K) slots and
pick the rest on their own (kgen.sparse_testing's indexer shape), so a row tile of n tokens reads
shared + n * own keys and a request's union is shared + T * own. The row tiles of a split read
their slices side by side, so DRAM sees each union row once. The kernel is the one the step picks
by size (kgen/sparse.py prefers_union), or either on request: a union item lists its share of its
row tile's union after building that list (it scans all of its tile's entries and inserts those of
its hash partition; a one-token tile lists its entries as they are); a gather item's keys are its
share of the tile's entries, one a (token, key), and it builds nothing.

The sparse loop is latency-bound (bench/NOTES.md: ~1.7-1.9 us a 32-key tile a CTA with one CTA an SM
or two; s55a: most of it the rows' round trip), so a tile takes a CTA

    tile = max(chain_us, CTAs sharing its SM x the tile's compute from the kernel's SASS / clock)

and an item starts after item_us (its schedule lookup, Q's rows, its partial state) plus, for the
union, list_us (its key list's fixed part: the set's clear and compaction, the list's writes, the
fence before its loop), scan_cycles per entry of its row tile and insert_cycles per entry it inserts.
chain_us is a time, not cycles: the rows' memory latency does not shrink with a faster clock. The
combine of the bf16 partial states costs combine_us. Of these six terms (SparseCalibration) item_us
is traced (bench.cta_trace), scan_cycles and insert_cycles are measured (bench.union_build_probe: kgen's
builder alone), and the other three are fitted on bench.sparse measurements of both plans (python -m
bench.sparse_model_table); the tile's compute and the combine's load chains use the dense
calibration. A MODEL, not a measurement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache

from .arch import Arch, get_arch
from . import kvrows
from .model import (CALIBRATION_FILE, Call, Floor, Item, Prediction, Shape, calibration, combine_shape, compute_cycles,
                    tile_work)
from .plan import plan
from .sparse_plan import (PART_O_BYTES, UNBOUNDED, list_capacity, request_splits, sparse_tiles, tile_tokens, tree_apart,
                          union_by_size)
from .splitkv import ceil_div
from .variant import PlanContext
from .spec import Spec

KERNELS = {"union": "sparse_verify_attn", "gather": "sparse_gather_attn"}


@dataclass(frozen=True)
class SparseCalibration:
    """The sparse path's own terms (module docstring): traced, measured, or fitted by python -m
    bench.sparse_model_table (its MEASURED names the first two kinds)."""

    chain_us: float  # the least time a CTA spends on a key tile, whatever its SM runs beside it (its rows' round trip)
    item_us: float  # a work item's time outside its tile loop and key list
    list_us: float  # a union item's key list beyond its entries (clear, compaction, the list's writes, fence)
    scan_cycles: float  # per entry of its row tile a union item's build reads
    insert_cycles: float  # per entry a union item's build inserts (its hash partition's share)
    combine_us: float  # the sparse combine (bf16 partial states, launched under the attention kernel's tail)


@lru_cache(maxsize=None)
def sparse_calibration() -> SparseCalibration:
    return SparseCalibration(**json.loads(CALIBRATION_FILE.read_text())["sparse"])


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


def predict_sparse(spec: Spec, s: SparseShape, arch: str | Arch, *, plan_for: str | None = None,
                   kernel: str | None = None, cal: SparseCalibration | None = None) -> Prediction:
    """Modeled time of one sparse_verify_attention call of `s` on `arch` with the plan for `plan_for`,
    on `kernel` ("union" or "gather"; default: the one the step picks by size). The tree keys come
    as the pool stores them (the step's contract: nothing to quantize in the call)."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    cal = cal or sparse_calibration()
    base = plan(spec, plan_for)
    p = plan(spec, base.arch, sparse_tiles(PlanContext(spec, base.arch, base.tiles, "")))
    sh, bm, bn = replace(s.shape, stored_tree=True), p.tiles.bm, p.tiles.bn
    heads = spec.model.num_q_heads
    tokens = min(sh.T, tile_tokens(heads, bm))
    entries = tokens * spec.model.index_topk
    target = arch.sm_count * p.tiles.min_blocks
    union = union_by_size(heads, bm, sh.B * sh.T, target, p.tiles.min_blocks) if kernel is None else kernel == "union"
    max_chunk = UNBOUNDED if union else list_capacity(p.variant("sparse_verify_attn").constants["TABLE"])
    row_tiles, splits = request_splits(heads, bm, sh.T, spec.model.index_topk, target, max_chunk, sh.B)
    keys = (unions(spec, s, tokens) if union else entries) / splits  # a row tile's share of its split
    request_bytes = unions(spec, s, sh.T) / splits * kvrows.row_bytes(spec)
    tree_tiles = ceil_div(sh.T, bn)
    apart = tree_apart(sh.B, row_tiles, splits, target)  # then the tree is one more split
    # a union item scans its row tile's entries and inserts its hash partition's share (a one-token
    # tile's entries are distinct: it lists them as the gather does, bench/NOTES.md v52)
    builds = union and tokens > 1
    build = entries * cal.scan_cycles + entries / splits * cal.insert_cycles if builds else 0.0
    items = []
    for split in range(splits):
        tiles = max(1, ceil_div(round(keys), bn) + (tree_tiles if split == splits - 1 and not apart else 0))
        items += [Item(tiles, request_bytes / row_tiles / tiles)] * row_tiles
    if apart:
        items += [Item(tree_tiles, 0.0)] * row_tiles  # the tree's rows come from k_tree, not the cache
        splits += 1
    dense = calibration()
    work = tile_work(p, arch, KERNELS["union" if union else "gather"])
    all_items = tuple(items * sh.B)
    call = Call(spec, sh, arch, p, work, all_items, splits, *combine_shape(p, sh, arch, len(all_items), splits),
                part_o_bytes=PART_O_BYTES, paged_keys=False)
    # the CTAs that share an SM: min_blocks once the grid fills every SM, fewer where it does not
    sharing = min(p.tiles.min_blocks, ceil_div(len(all_items), arch.sm_count))
    cycles, pipe = compute_cycles(work, arch, dense)
    tile_us = sharing * cycles / (arch.clock_ghz * 1e3)
    if cal.chain_us >= tile_us:
        tile_us, pipe = cal.chain_us, "latency"
    startup = cal.item_us + (cal.list_us if builds else 0.0) + build / (arch.clock_ghz * 1e3)
    prediction = call.finish(replace(dense, combine_us=cal.combine_us), tile_us, pipe, startup)
    return replace(prediction, floor=sparse_floor(spec, s, arch))


# The shapes `kgen show` models for a sparse spec: the main shape first.
def show_shapes(spec: Spec) -> list[SparseShape]:
    h, p = spec.model.num_q_heads, spec.cache.page_size
    t = min(16, spec.tree.nodes)
    return [SparseShape(Shape(h, t, 131072, 1, p), 0.7), SparseShape(Shape(h, t, 131072, 8, p), 0.7),
            SparseShape(Shape(h, t, 32768, 32, p), 0.7), SparseShape(Shape(h, 1, 131072, 1, p), 0.7),
            SparseShape(Shape(h, min(64, spec.tree.nodes), 131072, 1, p), 0.5),
            SparseShape(Shape(h, t, 131072, 1, p), 0.0)]
