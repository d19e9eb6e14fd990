"""What the host knows of the split-KV schedule (templates/schedule.cuh), which every attention CTA
computes for itself on the device: its parameters, its rule (the performance model's copy), and
upper bounds of its work items (the grids).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SPLIT_TILES = 4  # a split reads at least 4 KV tiles, so partial states stay a small overhead
# A call whose row tiles could fill more than a wave of CTAs weighs chunks that fill 1 .. SPLIT_WAVES
# waves (its rows alone cannot balance one wave); others one wave only, so their grids hold no more
# empty CTAs than one wave (a wave of them costs CTA launches and the schedule: ~5 us on the H200,
# bench/NOTES.md v24).
SPLIT_WAVES = 4
# Halving (templates/schedule.cuh): a request's KV tiles cut into 2 .. MAX_LEVELS pieces of halving
# size, the big ones first, where equal splits would leave the last wave part-empty (bench/NOTES.md v65).
MAX_LEVELS = 4


STAMP_WORDS = 12  # templates/schedule.cuh: a schedule table's stamp


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def table_items(batch: int) -> int:
    """Byte offset of a schedule table's items (templates/schedule.cuh ScheduleTable::items): its
    stamp and lengths, rounded up to 16 bytes."""
    return -(-(STAMP_WORDS + 2 * batch + 1) // 4) * 16


def table_bytes(grid: int, batch: int) -> int:
    """A schedule table (dense or sparse): stamp and lengths, then an int4 item per CTA and an int4
    req_meta per request."""
    return table_items(batch) + 16 * grid + 16 * batch


@dataclass(frozen=True)
class Capacity:
    """Upper bounds of the schedule's work items for one batch: the attention grids."""

    prefix: int  # of a call with a prefix (prefix_attn, verify_attn)
    tree: int  # of a tree-only call (tree_attn: one item per row tile)


def row_tiles_of(tokens: int, heads: int, bm: int, group: int = 1) -> int:
    """A request's row tiles: ceil(T H / BM), in whole groups (the CTAs of a cluster)."""
    return ceil_div(ceil_div(tokens * heads, bm), group) * group


def row_tile_bound(heads: int, bm: int, total_tokens: int, batch: int, group: int = 1) -> int:
    """sum_b row_tiles_of(T_b) <= ceil(total_tokens * H / BM) + batch * group: known before the
    lengths are."""
    return ceil_div(total_tokens * heads, bm) + batch * group


def waves_of(row_tile_bound: int, target_ctas: int) -> int:
    """How many waves of CTAs the schedule's chunks may fill (see SPLIT_WAVES)."""
    return 1 if row_tile_bound <= target_ctas else SPLIT_WAVES


def work_capacity(heads: int, bm: int, total_tokens: int, batch: int, target_ctas: int, group: int = 1) -> Capacity:
    """Every chunk the schedule tries is >= ceil(W / (waves target)) KV tiles, so prefix items
    number at most waves x target + sum_b mtiles_b (row_tile_bound); grids come in whole groups."""
    mtiles = row_tile_bound(heads, bm, total_tokens, batch, group)
    prefix = waves_of(mtiles, target_ctas) * target_ctas + mtiles
    return Capacity(ceil_div(prefix, group) * group, ceil_div(mtiles, group) * group)


def chunk_candidates(work: int, longest_request: int, target_ctas: int, waves: int) -> list[int]:
    """The chunks (KV tiles a split reads at most) the schedule weighs, in the order it weighs
    them: no split, then for w = 1 .. waves the chunk ceil(W / (w target)) and that chunk rounded
    up to cut the longest request into equal splits."""
    out = [max(MIN_SPLIT_TILES, longest_request)]
    for w in range(1, waves + 1):
        chunk = max(MIN_SPLIT_TILES, ceil_div(work, w * target_ctas))
        out += [chunk, max(MIN_SPLIT_TILES, ceil_div(longest_request, max(1, longest_request // chunk)))]
    return out


def splits_of(kv_tiles: int, chunk: int, min_splits: int) -> tuple[int, int]:
    """(splits, KV tiles per split) of a request: as few splits as the chunk allows, of equal size
    (the last may be shorter)."""
    splits = max(min_splits, ceil_div(kv_tiles, chunk))
    return splits, ceil_div(kv_tiles, splits) if splits else 0


@dataclass(frozen=True)
class SplitRule:
    """How a call's requests are split: equal splits of at most `chunk` KV tiles (levels 0), or
    halving into `levels` pieces."""

    chunk: int
    levels: int = 0


def halving_pieces(kv_tiles: int, levels: int) -> list[tuple[int, int]]:
    """The KV tiles [begin, end) of each level of a request halved into `levels` pieces: n/2, n/4, ..,
    the last piece what is left."""
    n = kv_tiles
    return [(n - (n >> j), n - (n >> (j + 1)) if j + 1 < levels else n) for j in range(levels)]


def choose_split(row_tiles: list[int], kv_tiles: list[int], target_ctas: int, min_splits: int,
                 waves: int) -> SplitRule:
    """The schedule's split rule for requests of these row and KV tiles: the chunk candidate whose
    waves of work items, each as long as the longest item plus MIN_SPLIT_TILES (its start and
    partial state, as the device counts it), end first (the first such, weighing chunks of 1 ..
    waves waves); then, where waves > 1, halving into 2 .. MAX_LEVELS levels where every request
    has MIN_SPLIT_TILES << (levels - 1) KV tiles and its items fit the grid ((levels - 1) R <= waves
    target), costed as list scheduling ends (the work spread over the CTAs plus the last piece, or
    the first piece), if it ends before."""
    work = sum(m * n for m, n in zip(row_tiles, kv_tiles))
    longest = max(kv_tiles, default=0)
    best, best_cost = SplitRule(0), None
    for chunk in chunk_candidates(work, longest, target_ctas, waves):
        items, split_tiles = 0, 0
        for m, n in zip(row_tiles, kv_tiles):
            splits, per_split = splits_of(n, chunk, min_splits)
            items += m * splits
            split_tiles = max(split_tiles, per_split)
        cost = ceil_div(items, target_ctas) * (split_tiles + MIN_SPLIT_TILES)
        if best_cost is None or cost < best_cost:
            best, best_cost = SplitRule(chunk), cost
    if waves == 1:
        return best
    rows, shortest = sum(row_tiles), min(kv_tiles, default=0)
    for levels in range(2, MAX_LEVELS + 1):
        if shortest < MIN_SPLIT_TILES << (levels - 1) or (levels - 1) * rows > waves * target_ctas:
            break
        filled = ceil_div(work + levels * rows * MIN_SPLIT_TILES, target_ctas)
        cost = max(filled + (longest >> (levels - 1)), longest - (longest >> 1)) + MIN_SPLIT_TILES
        if cost < best_cost:
            best, best_cost = SplitRule(best.chunk, levels), cost
    return best
