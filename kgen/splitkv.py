"""What the host knows of the split-KV schedule (templates/schedule.cuh), which every attention CTA
computes for itself on the device: its parameters, and upper bounds of its work items (the grids).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SPLIT_TILES = 4  # a split reads at least 4 KV tiles, so partial states stay a small overhead


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Capacity:
    """Upper bounds of the schedule's work items for one batch: the attention grids."""

    prefix: int  # of a call with a prefix (prefix_attn, verify_attn)
    tree: int  # of a tree-only call (tree_attn: one item per row tile)


def work_capacity(heads: int, bm: int, total_tokens: int, batch: int, target_ctas: int) -> Capacity:
    """The schedule picks a split of ceil(W / target) KV tiles, so prefix items number at most
    target + sum_b mtiles_b, and sum_b mtiles_b <= ceil(total_tokens * H / BM) + batch."""
    mtiles = ceil_div(total_tokens * heads, bm) + batch
    return Capacity(target_ctas + mtiles, mtiles)
