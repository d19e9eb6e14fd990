"""Timing that never hits L2 on a repeated buffer: K calls, each on its own input set, captured
back to back in one CUDA graph; a replay runs all K; time per call = median replay time / K.

K is chosen so that the K sets' KV together are several times the L2 cache, so by the time a set
comes round again its rows are long evicted. Back-to-back calls in one graph is also how a
server runs them (one call per layer under CUDA-graph replay), so launch overhead is amortized
the same way; --no-graph times the same rotation eagerly instead (Python launch overhead included).
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch


def events_ms(run: Callable[[], None], reps: int) -> list[float]:
    """Milliseconds of `reps` back-to-back calls, each between its own pair of CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def capture(run: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `run`, warmed up first on a side stream as torch recommends before capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    return g


def time_rotation(calls: Sequence[Callable[[], object]], *, graph: bool = True, budget_ms: float = 150.0,
                  min_reps: int = 3, max_reps: int = 200) -> float:
    """Microseconds per call: `calls` are the same op on K different input sets."""
    def run_all():
        for c in calls:
            c()

    run_all()  # compiles/initializes anything lazy (Triton JIT) outside the capture
    torch.cuda.synchronize()
    g = None
    if graph:
        g = capture(run_all)
        run = g.replay
    else:
        run = run_all
    first = events_ms(run, 1)[0]
    reps = int(min(max_reps, max(min_reps, budget_ms / max(first, 1e-3))))
    ms = statistics.median(events_ms(run, reps))
    del g
    return ms * 1e3 / len(calls)
