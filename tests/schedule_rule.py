"""The split-KV schedule's rule as DESIGN §5 / templates/schedule.cuh state it, written out item by
item so tests can check the device schedule (req_meta), the grids and the performance model's
copy (kgen.splitkv.choose_chunk, kgen.model.work_items) against it."""

from __future__ import annotations

from kgen.splitkv import MIN_SPLIT_TILES

SPLIT_WAVES = 4  # the waves of CTAs the schedule's chunks fill at most
MAX_LEVELS = 4  # halving's most pieces a request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rule_waves(heads: int, bm: int, tokens: list[int], target: int, group: int = 1) -> int:
    """SPLIT_WAVES where the row tiles could fill more than a wave: ceil(sum T * H / BM) + B group >
    target; else 1."""
    return SPLIT_WAVES if cdiv(sum(tokens) * heads, bm) + len(tokens) * group > target else 1


def rule_split(row_tiles: list[int], kv_tiles: list[int], target: int, min_splits: int, waves: int) -> tuple[int, int]:
    """(chunk, levels): of no split, and for w = 1 .. waves the chunk max(MIN_SPLIT_TILES, ceil(W / (w
    target))) and that chunk rounded up to cut the longest request into equal splits, the first
    whose ceil(items / target) waves of the longest item (plus MIN_SPLIT_TILES) end first, levels 0.
    Where waves > 1, halving into `levels` = 2 .. MAX_LEVELS pieces (every request has >= MIN_SPLIT_TILES
    << (levels - 1) KV tiles, and (levels - 1) R <= waves target) costs max(ceil((W + levels R
    MIN_SPLIT_TILES) / target) + (n_max >> (levels - 1)), n_max - (n_max >> 1)) + MIN_SPLIT_TILES and
    replaces the chunk where strictly cheaper than the best so far."""
    work, longest = sum(m * n for m, n in zip(row_tiles, kv_tiles)), max(kv_tiles)
    chunks = [max(MIN_SPLIT_TILES, longest)]
    for w in range(1, waves + 1):
        c = max(MIN_SPLIT_TILES, cdiv(work, w * target))
        chunks += [c, max(MIN_SPLIT_TILES, cdiv(longest, max(1, longest // c)))]

    def cost(c: int) -> int:
        splits = [max(min_splits, cdiv(n, c)) for n in kv_tiles]
        items = sum(m * s for m, s in zip(row_tiles, splits))
        return cdiv(items, target) * (max(cdiv(n, s) if s else 0 for n, s in zip(kv_tiles, splits)) + MIN_SPLIT_TILES)

    costs = [cost(c) for c in chunks]
    best = min(costs)
    chunk, levels = chunks[costs.index(best)], 0
    rows = sum(row_tiles)
    for n_levels in range(2, MAX_LEVELS + 1):
        if waves == 1 or min(kv_tiles) < MIN_SPLIT_TILES << (n_levels - 1) or (n_levels - 1) * rows > waves * target:
            break
        c = max(cdiv(work + n_levels * rows * MIN_SPLIT_TILES, target) + (longest >> (n_levels - 1)),
                longest - longest // 2) + MIN_SPLIT_TILES
        if c < best:
            best, levels = c, n_levels
    return chunk, levels


def halving(n: int, levels: int) -> list[tuple[int, int]]:
    """A request's n KV tiles in `levels` pieces: [0, n - n // 2), then each next piece half of
    what is left (rounded up), the last piece all that is left."""
    pieces, begin = [], 0
    for j in range(levels):
        end = n if j == levels - 1 else begin + cdiv(n - begin, 2)
        pieces.append((begin, end))
        begin = end
    return pieces


def schedule_items(heads: int, bm: int, bn: int, tokens: list[int], keys: list[int], target: int,
                   min_splits: int, group: int = 1) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """The work items in CTA order, (request, row tile, first KV tile, end KV tile), and per request
    (first item, splits, stride, row tiles), split s of row tile r being item first + s stride + r:
    request b has ceil(T_b H / BM) row tiles and ceil(L_b / BN) KV tiles. Equal splits: request b gets
    max(min_splits, ceil(kv tiles / chunk)) splits of equal size (ceil(kv tiles / splits), the last
    shorter); items run split-major, row tile fastest, requests in order (stride: its row tiles).
    Halving: every request's pieces (halving above); items run level-major — every request's row
    tiles (in order) at level 0, then at level 1, .. (stride: all requests' row tiles). With clusters
    of `group` CTAs a request's row tiles are padded to whole groups."""
    row_tiles = [cdiv(cdiv(t * heads, bm), group) * group for t in tokens]
    kv_tiles = [cdiv(k, bn) for k in keys]
    chunk, levels = rule_split(row_tiles, kv_tiles, target, min_splits, rule_waves(heads, bm, tokens, target, group))
    items, meta = [], []
    if levels:
        rows = sum(row_tiles)
        firsts = [sum(row_tiles[:b]) for b in range(len(row_tiles))]
        meta = [(first, levels, rows, m) for first, m in zip(firsts, row_tiles)]
        for j in range(levels):
            items += [(b, r, *halving(n, levels)[j]) for b, (m, n) in enumerate(zip(row_tiles, kv_tiles)) for r in range(m)]
        return items, meta
    for b, (m, n) in enumerate(zip(row_tiles, kv_tiles)):
        splits = max(min_splits, cdiv(n, chunk))
        size = cdiv(n, splits) if splits else 0
        meta.append((len(items), splits, m, m))
        items += [(b, r, s * size, min(n, (s + 1) * size)) for s in range(splits) for r in range(m)]
    return items, meta
