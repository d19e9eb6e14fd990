"""The split-KV schedule's rule as DESIGN §5 / templates/schedule.cuh state it, written out item by
item so tests can check the device schedule (req_meta), the grids and the performance model's
copy (kgen.model.work_items) against it."""

from __future__ import annotations

from kgen.splitkv import MIN_SPLIT_TILES


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def schedule_items(heads: int, bm: int, bn: int, tokens: list[int], keys: list[int], target: int,
                   min_splits: int) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int]]]:
    """The work items in CTA order, (request, row tile, first KV tile, end KV tile), and per request
    (first item, splits, row tiles): request b has ceil(T_b H / BM) row tiles and ceil(L_b / BN) KV
    tiles; all the work W is cut into chunks of max(MIN_SPLIT_TILES, ceil(W / target)) KV tiles;
    request b gets max(min_splits, ceil(kv tiles / chunk)) splits; items run split-major, row tile
    fastest, requests in order."""
    row_tiles = [cdiv(t * heads, bm) for t in tokens]
    kv_tiles = [cdiv(k, bn) for k in keys]
    chunk = max(MIN_SPLIT_TILES, cdiv(sum(m * n for m, n in zip(row_tiles, kv_tiles)), target))
    items, meta = [], []
    for b, (m, n) in enumerate(zip(row_tiles, kv_tiles)):
        splits = max(min_splits, cdiv(n, chunk))
        meta.append((len(items), splits, m))
        items += [(b, r, s * chunk, min(n, (s + 1) * chunk)) for s in range(splits) for r in range(m)]
    return items, meta
