"""What the sparse call's key rows cost to move, with nothing else in the kernel (issue 21's B = 1).

The B = 1 gather (B1 L131072 T16, 656-B rows) lands a CTA's 32-row tiles every ~1.7 us whoever issues
their copies (bench/NOTES.md v111), which is either the memory system's rate for these rows or the
kernel's own chain. bench/gather_probe.cu moves the same rows in kernels that do nothing else, for
the row sets of each design a B = 1 call could use:

- gather16: kgen's gather today: 8 row tiles of 2 tokens x 32 splits, each split 128 (token, key)
  entries of its tile (each token's whole list, 32,768 rows a call);
- union16: each 2-token tile's union, in 32 splits (the sm_90 plan's union kernel);
- union64: each 8-token tile's union (a 64-row tile), in 128 splits;
- union128: the request's union (every token's list merged), in 256 splits (a 128-row tile);
- gather_t1: one token's list in 32 splits (T = 1);
- empty: the same grid with no rows (the launch and the kernel's start).

Modes (gather_probe.cu): 0 kgen's producer (one bulk copy a row, a tile's slots fetched a tile
ahead), 1 the same with every slot loaded first, 2 16-byte loads by every warp into registers.
Each shape runs at 1 and 2 CTAs an SM (dynamic shared memory sets the occupancy), timed by CUDA-graph
replay over rotated sets of rows (kgen/timing.py): every set its own slots of a pool larger than L2.

    python -m bench.gather_probe --out DIR [--shape B,L,T] [--modes 0,1,2] [--ctas-per-sm 2,1]

A batched shape's designs split each row tile so that a wave holds about 256 CTAs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import torch

from bench.ceilings import SourceKernel
from kgen.sparse_testing import indexer_lists
from kgen.timing import time_rotation

SOURCE = Path(__file__).with_name("gather_probe.cu")
HEADER = Path(__file__).parents[1] / "templates" / "common.cuh"
ROW = 656
BN, STAGES = 32, 4
RING_BYTES = STAGES * BN * ROW + 2 * STAGES * 8 + 1024 * 4  # ring, barriers, held slots (MODE 1)
SMEM_FOR_CTAS = {1: 200 * 1024, 2: 110 * 1024}  # dynamic shared memory that leaves n CTAs an SM (H100/H200)
assert RING_BYTES <= min(SMEM_FOR_CTAS.values())


class Probe(SourceKernel):
    def __init__(self, device: torch.device, mode: int):
        super().__init__(device, SOURCE, "gather_probe", {"kgen/common.cuh": HEADER.read_text()},
                         (f"-DMODE={mode}", f"-DBN={BN}", f"-DSTAGES={STAGES}"), max(SMEM_FOR_CTAS.values()))
        self.out = torch.empty(1 << 16, dtype=torch.float32, device=device)

    def __call__(self, pool: torch.Tensor, slots: torch.Tensor, begin: torch.Tensor, smem: int) -> None:
        self.launch(begin.numel() - 1, 160, (pool.data_ptr(), slots.data_ptr(), begin.data_ptr(), self.out.data_ptr()),
                    (ctypes.c_void_p,) * 4, smem)


def splits_of(rows: list[torch.Tensor], splits: int) -> list[torch.Tensor]:
    """Each row set cut into `splits` near-equal parts, in order (kgen's split_entries)."""
    out = []
    for r in rows:
        per = -(-r.numel() // splits)
        out += [r[s * per:(s + 1) * per] for s in range(splits)]
    return out


def row_sets(requests: list[torch.Tensor], ctas: int = 256) -> dict[str, list[torch.Tensor]]:
    """Per design, the slots each CTA moves, for requests' [T, K] lists: a design's row tiles of n
    tokens each split in max(1, ctas // tiles) (a wave of about `ctas` CTAs, as kgen's schedule)."""
    def tiles(n: int) -> list[torch.Tensor]:
        return [r[t:t + n] for r in requests for t in range(0, r.shape[0], n)]

    def cut(parts: list[torch.Tensor]) -> list[torch.Tensor]:
        return splits_of(parts, max(1, ctas // len(parts)))

    sets = {"gather16": cut([t.reshape(-1) for t in tiles(2)]), "union16": cut([torch.unique(t) for t in tiles(2)]),
            "union64": cut([torch.unique(t) for t in tiles(8)]), "union128": cut([torch.unique(t) for t in tiles(16)])}
    if len(requests) == 1:
        sets["gather_t1"] = splits_of([requests[0][0]], 32)  # T1: one token's list, the gather's 32 splits
    sets["empty"] = [requests[0][0][:0]] * ctas
    return sets


def packed(parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = torch.tensor([0] + [p.numel() for p in parts])
    slots = torch.cat(parts) if sum(p.numel() for p in parts) else torch.zeros(1, dtype=torch.long)
    return slots.to(torch.int32), sizes.cumsum(0).to(torch.int32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--shape", default="1,131072,16", metavar="B,L,T", help="requests, prefix length, tokens each")
    ap.add_argument("--modes", default="0,1,2")
    ap.add_argument("--ctas-per-sm", default="2,1")
    args = ap.parse_args()
    b, length, t = map(int, args.shape.split(","))
    device = torch.device("cuda")
    g = torch.Generator(device).manual_seed(0)
    # rotated sets: each its own slots of the pool, together >= 3x L2 in the rows a union design moves
    sets = min(24, max(2, -(-3 * (50 << 20) // (b * min(length, 11000) * ROW))))
    pool = torch.empty(sets * b * length, ROW, dtype=torch.uint8, device=device)
    designs = {}
    for k in range(sets):
        requests = [indexer_lists(torch.arange(length, device=device) + (k * b + r) * length, t, 2048, shared=0.7,
                                  window=256, generator=g).cpu() for r in range(b)]
        for name, parts in row_sets(requests).items():
            designs.setdefault(name, []).append(tuple(x.to(device) for x in packed(parts)))
    rows = []
    for mode in map(int, args.modes.split(",")):
        probe = Probe(device, mode)
        for ctas in map(int, args.ctas_per_sm.split(",")):
            for name, runs in designs.items():
                calls = [lambda s=s, c=c: probe(pool, s, c, SMEM_FOR_CTAS[ctas]) for s, c in runs]
                us = time_rotation(calls)
                moved = runs[0][1][-1].item()
                row = dict(shape=args.shape, mode=mode, ctas_per_sm=ctas, design=name, grid=runs[0][1].numel() - 1,
                           rows=moved, mb=round(moved * ROW / 1e6, 2), us=round(us, 2),
                           tbps=round(moved * ROW / (us * 1e-6) / 1e12, 2) if moved else None,
                           regs=probe.report.registers)
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"gather-probe-{args.shape.replace(',', '-')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    (args.out / name).write_text(json.dumps(dict(device=torch.cuda.get_device_name(device), rows=rows), indent=1))


if __name__ == "__main__":
    main()
