"""What building a row tile's key list costs, with nothing else in the kernel (issue 21's batched union).

The union kernel's CTAs each build their key list before they attend it: split s of a row tile's S
scans all of the tile's entries (tokens x K list entries) and inserts those of its hash partition
(templates/sparse_attention.cuh build_union). The fitted model prices that scan at ~2.8 cycles an
entry (bench/NOTES.md s55b), which is why row tiles of more tokens lose at B8 (every split would scan
8 tokens' 16,384 entries) unless the build is shared by a tile's splits (s55d). One way to share it is
a key-list pass of its own before the attention kernel: a CTA per row tile builds the tile's whole
union, which the tile's splits then read in contiguous shares. bench/union_build_probe.cu times
kgen's own builder in both roles, each launch doing nothing else:

- split16 / split64: today's splits (160 threads, two CTAs an SM, partition s of S, every split scanning its whole
  2- or 8-token tile), S from kgen's schedule for the sm_90 plan's 264 CTAs;
- whole16 / whole64: one CTA of 512 threads per 2- or 8-token tile building the tile's whole union;
- clear16: split16's grid with no entries (the launch, the set's clear and compaction).

Timed by CUDA-graph replay over rotated sets of indexer-shaped lists (kgen.sparse_testing, 0.7
shared); each design's lengths are checked against torch.unique of its tiles' lists once.

    python -m bench.union_build_probe --out DIR [--shape B,L,T ...] [--templates DIR] [--profile DESIGN]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.ceilings import SourceKernel
from bench.gather_probe import SMEM_FOR_CTAS
from kgen.sparse_plan import request_splits, set_bytes
from kgen.sparse_testing import indexer_lists
from kgen.timing import time_rotation

SOURCE = Path(__file__).with_name("union_build_probe.cu")
TEMPLATES = Path(__file__).parents[1] / "templates"
HEADS, WIDTH, TARGET = 8, 2048, 264  # GLM-5's heads and top-k; the sm_90 plan's wave (2 CTAs x 132 SMs)
LOADS = 16


@dataclass(frozen=True)
class Design:
    tokens: int  # a row tile's tokens
    threads: int
    table: int  # hash-set entries (a power of two: the set holds up to half)
    whole: bool  # one CTA builds the tile's whole union (else the schedule's splits, one partition each)
    empty: bool = False  # no entries (the launch, clear and compaction alone)

    def smem(self) -> int:
        """The set, its counters and scan scratch, then the warps' insertion queues; a split's CTA asks
        for what leaves two CTAs an SM, as the union kernel's share one."""
        used = set_bytes(self.table) + self.threads // 32 * 32 * LOADS * 4
        return used if self.whole else max(used, SMEM_FOR_CTAS[2])

    def options(self) -> tuple[str, ...]:
        """The NVRTC options that build this design from bench/union_build_probe.cu."""
        return (f"-DSET_TABLE={self.table}", f"-DSET_TOKENS={self.tokens}", f"-DSET_LOADS={LOADS}",
                f"-DSET_THREADS={self.threads}")


def headers(templates: Path = TEMPLATES) -> dict[str, str]:
    """kgen's device headers as the probe includes them (kgen/NAME.cuh)."""
    return {f"kgen/{p.name}": p.read_text() for p in templates.glob("*.cuh")}


DESIGNS = {"split16": Design(2, 160, 8192, False), "split64": Design(8, 160, 8192, False),
           "whole16": Design(2, 512, 8192, True), "whole64": Design(8, 512, 16384, True),
           "clear16": Design(2, 160, 8192, False, empty=True)}


class BuildProbe(SourceKernel):
    def __init__(self, device: torch.device, d: Design, templates: Path = TEMPLATES):
        super().__init__(device, SOURCE, "union_build_probe", headers(templates), d.options(), d.smem())
        self.design = d

    def __call__(self, topk, tile_first, tile_tokens, parts: int, num_slots: int, out) -> None:
        slots, masks, count = out
        d = self.design
        self.launch(tile_first.numel() * parts, d.threads,
                    (topk.data_ptr(), WIDTH, tile_first.data_ptr(), tile_tokens.data_ptr(), parts, num_slots,
                     slots.shape[1], slots.data_ptr(), masks.data_ptr(), count.data_ptr()),
                    (ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                     ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p),
                    d.smem())


def tiles_of(batch: int, tokens: int, tile: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(first token, tokens) of each row tile of `tile` tokens of `batch` requests of `tokens` each."""
    first = [b * tokens + t for b in range(batch) for t in range(0, tokens, tile)]
    count = [min(tile, tokens - t) for _ in range(batch) for t in range(0, tokens, tile)]
    return (torch.tensor(first, dtype=torch.int32, device=device),
            torch.tensor(count, dtype=torch.int32, device=device))


def expected_lengths(topk: torch.Tensor, tile_first, tile_tokens) -> list[int]:
    return [int(torch.unique(topk[f:f + n]).ge(0).sum()) for f, n in zip(tile_first.tolist(), tile_tokens.tolist())]


def run_shape(device, batch: int, length: int, tokens: int, probes: dict, g, profile: bool = False) -> list[dict]:
    sets = 8
    lists = [torch.cat([indexer_lists(torch.arange(length, device=device) + (k * batch + r) * length, tokens, WIDTH,
                                      shared=0.7, window=256, generator=g) for r in range(batch)]).to(torch.int32)
             for k in range(sets)]
    num_slots = sets * batch * length
    rows = []
    for name, probe in probes.items():
        d = probe.design
        tile_first, tile_tokens = tiles_of(batch, tokens, d.tokens, device)
        if d.empty:
            tile_tokens = torch.zeros_like(tile_tokens)
        parts = 1 if d.whole else request_splits(HEADS, d.tokens * HEADS, tokens, WIDTH, TARGET, batch=batch)[1]
        grid = tile_first.numel() * parts
        out = (torch.empty(grid, d.tokens * WIDTH, dtype=torch.int32, device=device),
               torch.empty(grid, d.tokens * WIDTH, dtype=torch.int32, device=device),
               torch.full((grid,), -2, dtype=torch.int32, device=device))
        probe(lists[0], tile_first, tile_tokens, parts, num_slots, out)
        got = out[2].view(-1, parts)
        if d.empty:
            ok = bool((got == 0).all())
        else:
            ok = got.min().item() >= 0 and got.sum(1).tolist() == expected_lengths(lists[0], tile_first, tile_tokens)
        calls = [lambda t=t: probe(t, tile_first, tile_tokens, parts, num_slots, out) for t in lists]
        if profile:  # plain launches for a profiler (ncu -k regex:union_build --launch-skip 2 -c 1)
            for call in calls[:4]:
                call()
            torch.cuda.synchronize()
            continue
        us = time_rotation(calls)
        row = dict(shape=f"{batch},{length},{tokens}", design=name, tile_tokens=d.tokens, threads=d.threads,
                   splits=parts, grid=grid, us=round(us, 2), lengths_ok=ok, regs=probe.report.registers,
                   spills=probe.report.spill_stores)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--shape", action="append", metavar="B,L,T", help="requests, prefix length, tokens each "
                    "(default: 1,131072,16 8,131072,16 32,32768,16)")
    ap.add_argument("--templates", type=Path, default=TEMPLATES, help="kgen's headers from here (an A/B of the builder)")
    ap.add_argument("--profile", choices=sorted(DESIGNS), help="only this design, 4 plain launches a shape, untimed")
    args = ap.parse_args()
    shapes = args.shape or ["1,131072,16", "8,131072,16", "32,32768,16"]
    device = torch.device("cuda")
    g = torch.Generator(device).manual_seed(0)
    names = [args.profile] if args.profile else DESIGNS
    probes = {name: BuildProbe(device, DESIGNS[name], args.templates) for name in names}
    rows = [r for s in shapes for r in run_shape(device, *map(int, s.split(",")), probes, g, bool(args.profile))]
    if args.profile:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"union-build-probe-{args.templates.parent.name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    (args.out / name).write_text(json.dumps(dict(device=torch.cuda.get_device_name(device), rows=rows), indent=1))


if __name__ == "__main__":
    main()
