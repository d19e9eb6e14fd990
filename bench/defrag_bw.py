"""Memory-bound kernels against the copy bandwidth measured in the same run: kv_defrag on
disjoint moves (DESIGN §5, issue: >= 80% of copy at >= 256 MB) and merge_states.

    python -m bench.defrag_bw [--spec specs/glm5_sm120.yaml] [--rows 8192 65536] [--layers 78]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

import kgen

from .ceilings import copy_bandwidth
from kgen.timing import time_rotation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="specs/glm5_sm120.yaml")
    ap.add_argument("--rows", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--layers", type=int, default=78)
    args = ap.parse_args()
    dev = torch.device("cuda")
    mod = kgen.jit(kgen.load_spec(args.spec))
    d = mod.spec.model.head_dim
    copy_tbps, _, _ = copy_bandwidth(dev)
    print(f"copy bandwidth (read + write): {copy_tbps:.2f} TB/s")
    for n in args.rows:
        # Disjoint moves: sources scattered over the first half of the pool, destinations over
        # the second half, as a defrag into free slots does.
        slots = 2 * n
        caches = torch.randn(args.layers, slots, d, device=dev).bfloat16()
        src = torch.randperm(n, device=dev)
        dst = n + torch.randperm(n, device=dev)
        expected = caches[:, src].clone()
        mod.defrag(caches, src, dst)
        assert torch.equal(caches[:, dst], expected), "defrag moved the wrong bytes"
        us = time_rotation([partial(mod.defrag, caches, src, dst)], budget_ms=300)
        moved = args.layers * n * d * caches.element_size()
        tbps = 2 * moved / (us * 1e-6) / 1e12
        print(f"defrag {args.layers} layers x {n} rows ({moved / 2**20:.0f} MiB moved): {us:.1f} us, "
              f"{tbps:.2f} TB/s read+write = {100 * tbps / copy_tbps:.0f}% of copy")
        del caches, expected
    rows, h, dv = 65536, mod.spec.model.num_q_heads, mod.spec.model.value_dim
    for dtype in (torch.float32, torch.bfloat16):
        o = [torch.randn(rows, h, dv, device=dev).to(dtype) for _ in range(2)]
        lse = [torch.randn(rows, h, device=dev) for _ in range(2)]
        us = time_rotation([partial(mod.merge_states, o[0], lse[0], o[1], lse[1])], budget_ms=300)
        nbytes = 3 * o[0].numel() * o[0].element_size() + 3 * lse[0].numel() * 4
        tbps = nbytes / (us * 1e-6) / 1e12
        print(f"merge_states {dtype} {rows}x{h}x{dv}: {us:.1f} us, {tbps:.2f} TB/s = {100 * tbps / copy_tbps:.0f}% of copy")


if __name__ == "__main__":
    main()
