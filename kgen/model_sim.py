"""The performance model's schedule (kgen/model.py): the split-KV work items of a call of B identical
requests, as templates/schedule.cuh hands them out, and the fluid simulation of their CTAs on the
GPU's slots."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from . import kvrows
from .plan import Plan
from .splitkv import ceil_div, choose_split, halving_pieces, row_tile_bound, row_tiles_of, splits_of, waves_of


@dataclass(frozen=True)
class Shape:
    H: int
    T: int  # tree tokens per request; 1 = decode (prefix_attention alone)
    L: int  # prefix tokens per request
    B: int
    page_size: int = 1
    stored_tree: bool = False  # an fp8 verify's tree keys come as the pool stores them (not quantized in the call)

    @property
    def decode(self) -> bool:
        return self.T == 1

    @property
    def context_tokens(self) -> int:
        """The batch's prefix capacity as a step sees it (kv_indices pages x page size): what picks
        its tuned bucket."""
        return ceil_div(self.L, self.page_size) * self.page_size * self.B


@dataclass(frozen=True)
class Item:
    tiles: int  # KV tiles: prefix, then (verify, last split) the tree's
    dram_bytes: float  # bytes from DRAM per tile, averaged over the item's tiles


def work_items(p: Plan, shape: Shape, target_ctas: int) -> tuple[list[Item], int]:
    """The schedule of templates/schedule.cuh for B identical requests: the work items in CTA
    order, and the splits (partial states) of each row."""
    bm, bn, group = p.tiles.bm, p.tiles.bn, p.tiles.cluster
    row_tiles, kv_tiles = row_tiles_of(shape.T, shape.H, bm, group), ceil_div(shape.L, bn)
    min_splits = 0 if shape.decode else 1
    waves = waves_of(row_tile_bound(shape.H, bm, shape.T * shape.B, shape.B, group), target_ctas)
    rule = choose_split([row_tiles] * shape.B, [kv_tiles] * shape.B, target_ctas, min_splits, waves)
    if rule.levels:  # level-major: every request's row tiles at level 0, then level 1, ..
        pieces = halving_pieces(kv_tiles, rule.levels)
    else:
        splits, per_split = splits_of(kv_tiles, rule.chunk, min_splits)
        pieces = [(s * per_split, min(kv_tiles, (s + 1) * per_split)) for s in range(splits)]
    tile_bytes = bn * kvrows.row_bytes(p.spec)
    items = []
    for s, (begin, end) in enumerate(pieces):
        tree = ceil_div(shape.T, bn) if not shape.decode and s == len(pieces) - 1 else 0
        tiles = max(1, end - begin + tree)  # an empty split still runs its startup and writes a state
        # the request's row tiles run side by side (row tile fastest) and read the piece once
        item = Item(tiles, (end - begin) * tile_bytes / row_tiles / tiles)
        items += [item] * (row_tiles * shape.B if rule.levels else row_tiles)
    return (items if rule.levels else items * shape.B), len(pieces)


def simulate(items: list[Item], slots: int, compute_us: float, dram_bytes_per_us: float,
             startup_us: float) -> tuple[float, float]:
    """(makespan, time the tiles were DRAM-bound) of the items on `slots` CTA slots, in order.
    Running CTAs in their tile phase advance one tile per max(compute_us, their DRAM bytes per
    tile / dram_bytes_per_us): a shared progress clock (tiles done by any of them) keeps it
    O(items log items). compute_us includes the ring's latency bound."""
    now = progress = dram_bound = 0.0
    starting: list[tuple[float, int]] = []  # (time its startup ends, item)
    running: list[tuple[float, int]] = []  # (progress at which its tiles are done, item)
    demand = 0.0  # DRAM bytes per tile of the running CTAs
    queue = iter(range(len(items)))
    for _ in range(min(slots, len(items))):
        heapq.heappush(starting, (startup_us, next(queue)))
    while starting or running:
        tile_us = max(compute_us, demand / dram_bytes_per_us)
        to_start = starting[0][0] - now if starting else math.inf
        to_done = (running[0][0] - progress) * tile_us if running else math.inf
        dt = min(to_start, to_done)
        now += dt
        progress += dt / tile_us
        if running and tile_us > compute_us:
            dram_bound += dt
        if to_start <= to_done:
            _, i = heapq.heappop(starting)
            heapq.heappush(running, (progress + items[i].tiles, i))
            demand += items[i].dram_bytes
            continue
        _, i = heapq.heappop(running)
        demand -= items[i].dram_bytes
        if (j := next(queue, None)) is not None:
            heapq.heappush(starting, (now + startup_us, j))
    return now, dram_bound
