"""Tier-0 KV defragmentation: give a fragmented request one contiguous run of slots again.

With page size 1 (which SGLang needs for tree verify) a request's KV slots end up scattered over
the pool. This module is the pure logic, over two small abstractions so it can be tested on the
CPU with a fake pool and used on the GPU with SGLang's:

- a `SlotAllocator` (the free list): which slots are free, take some, give some back;
- a `SlotTable` (who owns what): each request's movable slots in token order, and a way to
  rewrite them (SGLang's req_to_token rows).

`plan()` picks the requests whose slots are fragmented beyond a threshold, most fragmented
first, and gives each the smallest free run that holds it (best fit, so large runs survive).
`apply()` takes those runs from the allocator, moves every request's rows in every layer with
one `move(src, dst)` call (kgen's kv_defrag launch on the GPU), rewrites the table, and only
then frees the old slots: no row is lost, and no slot is leaked or owned twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Protocol

import torch


class SlotAllocator(Protocol):
    def free_slots(self) -> torch.Tensor:
        """1-D int64 tensor of the free slots (any order, any device)."""

    def take(self, slots: torch.Tensor) -> None:
        """Remove these slots (all currently free) from the free list."""

    def release(self, slots: torch.Tensor) -> None:
        """Return these slots (owned, no longer used) to the free list."""


class SlotTable(Protocol):
    def rows(self) -> Iterable[tuple[Hashable, torch.Tensor]]:
        """(request key, its movable slots in token order) for every request."""

    def rewrite(self, key: Hashable, slots: torch.Tensor) -> None:
        """The request's movable tokens now live in `slots` (same order)."""


Move = Callable[[torch.Tensor, torch.Tensor], None]  # move(src, dst): every layer's row src[i] -> dst[i]


@dataclass(frozen=True)
class Relocation:
    key: Hashable
    old: torch.Tensor  # int64 slots, token order
    new: torch.Tensor  # int64, one contiguous run


def runs(slots: torch.Tensor) -> int:
    """Number of maximal runs of consecutive slots (token t+1 at slot s+1) in a row."""
    if slots.numel() == 0:
        return 0
    return 1 + int((slots[1:] != slots[:-1] + 1).sum())


def fragmentation(slots: torch.Tensor) -> float:
    """0 for a contiguous row, 1 when no two neighbouring tokens share a run."""
    n = slots.numel()
    return 0.0 if n < 2 else (runs(slots) - 1) / (n - 1)


def free_runs(free: torch.Tensor) -> list[tuple[int, int]]:
    """The free list as (start, length) runs of consecutive slots, in slot order."""
    if free.numel() == 0:
        return []
    s = torch.sort(free.to(device="cpu", dtype=torch.int64)).values
    breaks = torch.nonzero(s[1:] != s[:-1] + 1).flatten() + 1
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), breaks])
    ends = torch.cat([breaks, torch.tensor([s.numel()])])
    return [(int(s[a]), int(b - a)) for a, b in zip(starts.tolist(), ends.tolist())]


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.25  # move a request whose fragmentation exceeds this
    min_tokens: int = 64  # rows shorter than this are not worth a move
    max_tokens: int = 1 << 20  # tokens moved per pass at most (bounds the move's cost)


def plan(rows: Iterable[tuple[Hashable, torch.Tensor]], free: torch.Tensor, settings: Settings = Settings()
         ) -> list[Relocation]:
    """Relocations for the fragmented rows, each into its own run of currently free slots."""
    candidates = []
    for key, slots in rows:
        slots = slots.to(device="cpu", dtype=torch.int64)
        frag = fragmentation(slots)
        if slots.numel() >= settings.min_tokens and frag > settings.threshold:
            candidates.append((-frag, -slots.numel(), len(candidates), key, slots))
    candidates.sort(key=lambda c: c[:3])
    space = free_runs(free)
    budget = settings.max_tokens
    out = []
    for _, _, _, key, slots in candidates:
        n = slots.numel()
        if n > budget:
            continue
        fits = [i for i, (_, length) in enumerate(space) if length >= n]
        if not fits:
            continue
        i = min(fits, key=lambda j: space[j][1])  # best fit
        start, length = space[i]
        space[i] = (start + n, length - n)
        budget -= n
        out.append(Relocation(key, slots, torch.arange(start, start + n, dtype=torch.int64)))
    return out


def apply(relocations: list[Relocation], allocator: SlotAllocator, table: SlotTable, move: Move) -> None:
    """Take the new runs, move the rows (one call, all layers), rewrite the table, free the old slots."""
    if not relocations:
        return
    src = torch.cat([r.old for r in relocations])
    dst = torch.cat([r.new for r in relocations])
    allocator.take(dst)
    move(src, dst)
    for r in relocations:
        table.rewrite(r.key, r.new)
    allocator.release(src)


@dataclass
class DefragStats:
    passes: int = 0
    requests_seen: int = 0  # in the last pass
    fragmented: int = 0  # in the last pass: rows above the threshold
    moved_requests: int = 0  # all passes
    moved_tokens: int = 0  # all passes
    mean_fragmentation: float = 0.0  # of the last pass's rows before moving
    largest_free_run: int = 0  # after the last pass
    free_slots: int = 0  # after the last pass
    disabled: str = ""  # why defrag does not run here ("" when it does)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Defragmenter:
    """Runs plan + apply passes and keeps the fragmentation report."""

    settings: Settings = field(default_factory=Settings)
    stats: DefragStats = field(default_factory=DefragStats)

    def run(self, allocator: SlotAllocator, table: SlotTable, move: Move) -> list[Relocation]:
        rows = [(k, s.to(device="cpu", dtype=torch.int64)) for k, s in table.rows()]
        frags = [fragmentation(s) for _, s in rows]
        relocations = plan(rows, allocator.free_slots(), self.settings)
        apply(relocations, allocator, table, move)
        st = self.stats
        st.passes += 1
        st.requests_seen = len(rows)
        st.fragmented = sum(f > self.settings.threshold for f in frags)
        st.mean_fragmentation = sum(frags) / len(frags) if frags else 0.0
        st.moved_requests += len(relocations)
        st.moved_tokens += sum(r.new.numel() for r in relocations)
        free = allocator.free_slots()
        st.free_slots = int(free.numel())
        st.largest_free_run = max((length for _, length in free_runs(free)), default=0)
        return relocations
