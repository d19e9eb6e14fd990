"""Sparse (DSA) test inputs: verify inputs (kgen.inputs) plus top-k lists shaped like an indexer's.

A tree's tokens sit at the same position and share most of their top-k picks: each request's
lists hold a shared part (attention sinks, a recent window, common picks) and per-token picks,
in random order, with -1 entries sprinkled anywhere. Lists name physical slots of the request's
prefix (or, with `foreign`, some slots of other requests' prefixes: the kernel must not care).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import reference
from .inputs import Dims, VerifyInputs, fresh_seed, make_verify_inputs

SINKS = 4  # leading prefix tokens every list keeps


@dataclass
class SparseInputs:
    base: VerifyInputs  # q, kv_cache, k_tree, qo_indptr, tree_mask, ... (its prefix metadata made the slots)
    topk_indices: torch.Tensor  # [sum T, K'] int32 slots, -1 = no key

    def args(self, *, stored_tree: bool = False) -> tuple:
        """sparse_verify_attention's tensors; `stored_tree`: the tree keys as the cache stores them."""
        b = self.base
        return b.q, b.kv_cache, b.stored_k_tree if stored_tree else b.k_tree, b.qo_indptr, self.topk_indices, b.op_mask

    def ref(self):
        b = self.base
        return reference.sparse_verify_attention_ref(b.q, b.kv_cache, b.ref_k_tree, b.qo_indptr, self.topk_indices,
                                                     b.tree_mask, b.scale, b.value_dim, b.kv_scale)

    def union_sizes(self) -> list[int]:
        """Distinct listed slots of each request: the rows a union kernel reads once."""
        qo = self.base.qo_indptr.tolist()
        out = []
        for s, e in zip(qo, qo[1:]):
            rows = self.topk_indices[s:e]
            out.append(int(torch.unique(rows[rows >= 0]).numel()))
        return out

    def tile_rows(self, heads: int, bm: int) -> tuple[int, int]:
        """KV rows the two sparse kernels read over all row tiles of bm packed (token, head) rows:
        (the union kernel's: each tile's distinct listed slots, the gather's: each tile's listed
        entries, every token's own). Their ratio is what the union can gain over the gather at that
        tiling, its keys costing what the gather's do: a row tile of 2 tokens whose lists share a
        fraction s reads 2 - s lists' worth of rows instead of 2, at most 2 / (2 - s) fewer."""
        union = gather = 0
        qo = self.base.qo_indptr.tolist()
        for s, e in zip(qo, qo[1:]):
            for r0 in range(0, (e - s) * heads, bm):  # a tile's tokens: those of its packed rows
                rows = self.topk_indices[s + r0 // heads:s + min(e - s, (r0 + bm - 1) // heads + 1)]
                listed = rows[rows >= 0]
                union += int(torch.unique(listed).numel())
                gather += int(listed.numel())
        return union, gather


def prefix_slots(inputs: VerifyInputs, b: int) -> torch.Tensor:
    """The physical slots of request b's prefix tokens, in token order (int64)."""
    p = inputs.page_size
    pages = inputs.kv_indices[inputs.kv_indptr[b]:inputs.kv_indptr[b + 1]].long()
    t = torch.arange(int(inputs.kv_lens[b]), device=pages.device)
    return pages[t // p] * p + t % p


def indexer_lists(slots: torch.Tensor, tokens: int, width: int, *, shared: float, window: int,
                  generator: torch.Generator) -> torch.Tensor:
    """[tokens, width] int64 lists over a prefix whose token t sits at slots[t]: with L <= width
    every token lists the whole prefix (then -1s); otherwise SINKS sinks, the last `window` tokens
    and common picks make round(shared * width) entries every token lists, the rest are each
    token's own picks. Rows in random order."""
    dev, length = slots.device, slots.numel()
    if length <= width:
        picks = torch.arange(length, device=dev).expand(tokens, length)
        rows = torch.cat([picks, torch.full((tokens, width - length), -1, device=dev)], dim=1)
    else:
        n_shared = min(width, max(0, round(shared * width)))
        fixed = torch.unique(torch.cat([torch.arange(min(SINKS, length), device=dev),
                                        torch.arange(max(0, length - window), length, device=dev)]))[:n_shared]
        weight = torch.rand(length, generator=generator, device=dev)
        weight[fixed] = 2.0  # never among the common picks
        common = torch.topk(weight, n_shared - fixed.numel(), largest=False).indices
        shared_idx = torch.cat([fixed, common])
        own = torch.rand(tokens, length, generator=generator, device=dev)
        own[:, shared_idx] = 2.0
        picks = torch.topk(own, width - n_shared, dim=1, largest=False).indices
        rows = torch.cat([shared_idx.expand(tokens, n_shared), picks], dim=1)
    rows = torch.where(rows >= 0, slots[rows.clamp(min=0)], -1) if length else rows
    order = torch.rand(tokens, width, generator=generator, device=dev).argsort(dim=1)
    return rows.gather(1, order)


def make_sparse_inputs(spec_or_dims, tree_sizes: list[int], prefix_lens: list[int], width: int, *,
                       shared: float = 0.7, window: int = 64, holes: float = 0.0, foreign: float = 0.0,
                       device="cpu", generator: torch.Generator | None = None, **verify_kwargs) -> SparseInputs:
    """Verify inputs (make_verify_inputs) plus top-k lists of `width` entries per token: indexer-
    shaped over each request's prefix, then a fraction `holes` of entries set to -1 and a fraction
    `foreign` replaced by slots of other requests' prefixes (kept distinct within a row)."""
    device = torch.device(device)
    g = generator or torch.Generator(device).manual_seed(fresh_seed())
    base = make_verify_inputs(spec_or_dims, tree_sizes, prefix_lens, device=device, generator=g, **verify_kwargs)
    all_slots = [prefix_slots(base, b) for b in range(len(tree_sizes))]
    pool = torch.cat(all_slots) if all_slots else torch.zeros(0, dtype=torch.long, device=device)
    rows = []
    for b, (t, slots) in enumerate(zip(tree_sizes, all_slots)):
        r = indexer_lists(slots, t, width, shared=shared, window=window, generator=g)
        if foreign and pool.numel() > slots.numel():
            others = pool[~torch.isin(pool, slots)]  # never in this request's lists
            col = torch.arange(width, device=device)
            off = int(torch.randint(0, others.numel(), (), generator=g, device=device))
            swap = (torch.rand(r.shape, generator=g, device=device) < foreign) & (col < others.numel())
            r = torch.where(swap, others[(off + col) % others.numel()], r)  # one slot per column: rows stay distinct
        if holes:
            r = torch.where(torch.rand(r.shape, generator=g, device=device) < holes, -1, r)
        rows.append(r)
    topk = torch.cat(rows) if rows else torch.zeros(0, width, dtype=torch.long, device=device)
    return SparseInputs(base, topk.to(torch.int32).contiguous())


__all__ = ["Dims", "SparseInputs", "indexer_lists", "make_sparse_inputs", "prefix_slots"]
