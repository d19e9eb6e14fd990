"""The tier-0 defrag planner (kgen/integrations/defrag_planner.py) over random histories of
allocations, extensions, frees and defrag passes on a fake pool: every request's KV bytes in
every layer stay what was written, and the free list is exactly the complement of the owned slots.

The fake pool is plain torch tensors (per-layer KV rows, a free list, each request's slots in
token order) and `move` copies rows with reads before writes, as kgen's kv_defrag does. The same
history runner drives the GPU apply path (kgen's defrag launch) in tests/test_sglang_gpu.py.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.integrations.defrag_planner import (Defragmenter, Relocation, Settings, apply, fragmentation,
                                              free_runs, plan, runs)


class FakePool:
    """A page-size-1 KV pool: `kv` holds one [slots, *row] tensor per layer; slot 0 is reserved
    (SGLang keeps it for padded tokens), the others start free, in a shuffled order. Like SGLang's
    TokenToKVPoolAllocator, allocation takes the head of the free list and frees go to its end,
    so interleaved extensions and frees scatter the rows."""

    def __init__(self, num_slots: int, layers: list[torch.Tensor], seed: int):
        self.kv = layers
        self.num_slots = num_slots
        self.gen = torch.Generator().manual_seed(seed)
        self.free = torch.arange(1, num_slots, dtype=torch.int64)
        if seed % 2:  # half the histories start from a shuffled free list
            self.free = self.free[torch.randperm(num_slots - 1, generator=self.gen)]
        self.owned: dict[int, torch.Tensor] = {}  # request -> slots, token order
        self.written: dict[int, list[torch.Tensor]] = {}  # request -> per layer, the rows written
        self.next_key = 0

    # -- the SlotAllocator and SlotTable the planner sees --------------------------------------
    def free_slots(self) -> torch.Tensor:
        return self.free.clone()

    def take(self, slots: torch.Tensor) -> None:
        slots = slots.cpu()
        assert bool(torch.isin(slots, self.free).all()), "took a slot that is not free"
        self.free = self.free[~torch.isin(self.free, slots)]

    def release(self, slots: torch.Tensor) -> None:
        slots = slots.cpu()
        assert not bool(torch.isin(slots, self.free).any()), "freed a slot twice"
        self.free = torch.cat([self.free, slots])

    def rows(self):
        return list(self.owned.items())

    def rewrite(self, key, slots: torch.Tensor) -> None:
        assert slots.numel() == self.owned[key].numel()
        self.owned[key] = slots.cpu().clone()

    # -- what a serving engine does ---------------------------------------------------------------
    def _grab(self, n: int) -> torch.Tensor | None:
        if n > self.free.numel():
            return None
        slots, self.free = self.free[:n], self.free[n:]  # SGLang's order: the head of the free list
        return slots

    def _write(self, key: int, slots: torch.Tensor) -> None:
        rows = []
        for layer in self.kv:
            data = torch.randint(-1000, 1000, (slots.numel(), *layer.shape[1:]), generator=self.gen).to(layer.dtype)
            layer[slots.to(layer.device)] = data.to(layer.device)
            rows.append(data)
        old = self.written.get(key)
        self.written[key] = rows if old is None else [torch.cat([o, r]) for o, r in zip(old, rows)]

    def alloc(self, n: int) -> None:
        slots = self._grab(n)
        if slots is not None:
            key, self.next_key = self.next_key, self.next_key + 1
            self.owned[key] = slots
            self._write(key, slots)

    def extend(self, pick: int, n: int) -> None:
        if self.owned:
            key = sorted(self.owned)[pick % len(self.owned)]
            slots = self._grab(n)
            if slots is not None:
                self.owned[key] = torch.cat([self.owned[key], slots])
                self._write(key, slots)

    def finish(self, pick: int) -> None:
        if self.owned:
            key = sorted(self.owned)[pick % len(self.owned)]
            self.release(self.owned.pop(key))
            del self.written[key]

    # -- the invariants ----------------------------------------------------------------------------
    def check(self) -> None:
        owned = torch.cat([torch.zeros(0, dtype=torch.int64), *self.owned.values()])
        everything = torch.cat([owned, self.free])
        assert everything.numel() == self.num_slots - 1, "a slot was leaked or is owned twice"
        assert torch.equal(torch.sort(everything).values, torch.arange(1, self.num_slots)), \
            "the free list is not the complement of the owned slots"
        for key, slots in self.owned.items():
            for layer, written in zip(self.kv, self.written[key]):
                assert torch.equal(layer[slots.to(layer.device)].cpu(), written), f"request {key}: KV bytes changed"


def cpu_move(layers: list[torch.Tensor]):
    def move(src: torch.Tensor, dst: torch.Tensor) -> None:
        for layer in layers:
            layer[dst] = layer[src].clone()  # all reads before any write
    return move


OPS = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 24)),
    st.tuples(st.just("extend"), st.integers(0, 7), st.integers(1, 12)),
    st.tuples(st.just("extend"), st.integers(0, 7), st.integers(1, 12)),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("defrag"), st.sampled_from([0.0, 0.05, 0.3]), st.integers(1, 8), st.integers(4, 256)),
)
HISTORIES = st.lists(OPS, min_size=1, max_size=40)


def replay(history, pool: FakePool, move, defragmenter: Defragmenter | None = None) -> FakePool:
    for op, *args in history:
        if op == "defrag":
            threshold, min_tokens, max_tokens = args
            d = defragmenter or Defragmenter()
            d.settings = Settings(threshold=threshold, min_tokens=min_tokens, max_tokens=max_tokens)
            moved = d.run(pool, pool, move)
            for r in moved:
                assert runs(pool.owned[r.key]) == 1
        else:
            getattr(pool, op)(*args)
        pool.check()
    return pool


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=HISTORIES, seed=st.integers(0, 2**31 - 1), num_slots=st.integers(2, 400))
def test_random_histories_keep_every_row_and_the_free_list_exact(history, seed, num_slots):
    layers = [torch.zeros(num_slots, 3, dtype=torch.int32) for _ in range(4)]
    replay(history, FakePool(num_slots, layers, seed), cpu_move(layers))


def test_a_defrag_pass_makes_fragmented_rows_contiguous_and_reports_it(seed):
    layers = [torch.zeros(400, 2, dtype=torch.int64) for _ in range(3)]
    pool = FakePool(400, layers, 2 * seed)
    for key, slots in enumerate([torch.arange(1, 80, 2), torch.arange(2, 80, 2), torch.arange(300, 320)]):
        pool.take(slots)  # two interleaved rows and a contiguous one
        pool.owned[key] = slots
        pool._write(key, slots)
    pool.check()
    d = Defragmenter(Settings(threshold=0.1, min_tokens=8))
    moved = d.run(pool, pool, cpu_move(layers))
    pool.check()
    assert sorted(r.key for r in moved) == [0, 1] and all(runs(pool.owned[k]) == 1 for k in pool.owned)
    stats = d.stats.as_dict()
    assert stats["passes"] == 1 and stats["moved_requests"] == len(moved)
    assert stats["moved_tokens"] == sum(r.new.numel() for r in moved)
    assert stats["free_slots"] == pool.free.numel() and stats["largest_free_run"] >= 1


def test_runs_fragmentation_and_free_runs():
    assert runs(torch.tensor([5, 6, 7])) == 1 and fragmentation(torch.tensor([5, 6, 7])) == 0.0
    assert runs(torch.tensor([9, 3, 4, 1])) == 3 and fragmentation(torch.tensor([9, 3, 4, 1])) == 2 / 3
    assert runs(torch.tensor([], dtype=torch.int64)) == 0 and fragmentation(torch.tensor([4])) == 0.0
    assert free_runs(torch.tensor([7, 1, 2, 3, 9, 8, 20])) == [(1, 3), (7, 3), (20, 1)]
    assert free_runs(torch.tensor([], dtype=torch.int64)) == []


def test_plan_takes_the_smallest_run_that_fits_and_respects_the_budget():
    rows = [("a", torch.tensor([40, 2, 30, 11])), ("b", torch.tensor([50, 51, 52, 53])),
            ("c", torch.tensor([60, 1, 70, 3, 80, 5]))]
    free = torch.tensor([100, 101, 102, 103, 104, 105, 106, 107, 200, 201, 202, 203, 204, 205])
    got = plan(rows, free, Settings(threshold=0.2, min_tokens=2))
    assert [r.key for r in got] == ["c", "a"]  # most fragmented first; b is contiguous
    assert got[0].new.tolist() == list(range(200, 206))  # 6 fits the run of 6 exactly
    assert got[1].new.tolist() == list(range(100, 104))
    assert plan(rows, free, Settings(threshold=0.2, min_tokens=2, max_tokens=5))[0].key == "a"
    assert plan(rows, torch.tensor([1, 3, 5]), Settings(threshold=0.2, min_tokens=2)) == []


def test_apply_orders_take_move_rewrite_release():
    calls = []

    class Spy:
        def take(self, s): calls.append(("take", s.tolist()))
        def release(self, s): calls.append(("release", s.tolist()))
        def rewrite(self, k, s): calls.append(("rewrite", k, s.tolist()))

    spy = Spy()
    apply([Relocation("r", torch.tensor([9, 4]), torch.tensor([20, 21]))], spy, spy,
          lambda src, dst: calls.append(("move", src.tolist(), dst.tolist())))
    assert calls == [("take", [20, 21]), ("move", [9, 4], [20, 21]), ("rewrite", "r", [20, 21]),
                     ("release", [9, 4])]
