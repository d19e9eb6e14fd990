"""The MMA work and ring rows of one request's sparse verify, counted on the CPU from bench.sparse's
list model (issue 21's union against the gather; bench/NOTES.md, forty-third session), for 2-token
(16-row) MMA blocks at H = 8 and 32-key tiles:

- union: each 2-token row tile streams its own union (today's union kernel);
- gather: each row tile streams its tokens' entries, each token's own (today's gather kernel);
- request union: one CTA's row blocks share the request's union, its keys ordered shared-first and
  then by the row blocks that list them, a block skipping the key tiles none of its tokens lists.

    python -m bench.union_work

A unit is one row block times one key tile (the same MMAs in every kernel); ring rows are the KV
rows the CTAs stream. Where the loop, not the bytes, sets the time (the batched shapes on the H100:
s41e), the units bound what the union can gain over the gather.
"""

from __future__ import annotations

from functools import reduce

import kgen
from kgen.sparse_testing import make_sparse_inputs
from kgen.splitkv import ceil_div

BN, TOKENS = 32, 2  # keys a tile; tokens a 16-row block at H = 8
CASES = ((16, 0.7), (16, 0.5), (16, 0.9), (64, 0.5))


def count(lists: list[set[int]]) -> dict[str, tuple[int, int]]:
    """{kernel: (units, ring rows)} for one request's token lists."""
    blocks = [lists[p:p + TOKENS] for p in range(0, len(lists), TOKENS)]
    unions = [set().union(*b) for b in blocks]
    member: dict[int, int] = {}  # key -> bitmask of the row blocks that list it
    for i, u in enumerate(unions):
        for k in u:
            member[k] = member.get(k, 0) | 1 << i
    every = (1 << len(blocks)) - 1
    order = sorted(member, key=lambda k: (member[k] != every, (member[k] & -member[k]).bit_length(), member[k]))
    shared_units = sum(bin(reduce(lambda m, k: m | member[k], order[j:j + BN], 0)).count("1")
                       for j in range(0, len(order), BN))
    return {"union": (sum(ceil_div(len(u), BN) for u in unions), sum(map(len, unions))),
            "gather": (sum(ceil_div(sum(map(len, b)), BN) for b in blocks), sum(map(len, lists))),
            "request union": (shared_units, len(member))}


def main() -> None:
    spec = kgen.load_spec("specs/glm5_dsa_sm120.yaml")
    print(f"{'T':>3} {'shared':>6}  {'kernel':<13} {'units':>6} {'x':>5} {'ring rows':>9} {'x':>5}")
    for t, shared in CASES:
        x = make_sparse_inputs(spec, [t], [131072], spec.model.index_topk, shared=shared, window=256, device="cpu")
        counts = count([set(r[r >= 0].tolist()) for r in x.topk_indices])
        units, rows = counts["gather"]
        for name, (u, r) in counts.items():
            print(f"{t:>3} {shared:>6}  {name:<13} {u:>6} {units / u:>5.2f} {r:>9} {rows / r:>5.2f}")


if __name__ == "__main__":
    main()
