"""Random attention inputs in the DESIGN §5 layout, for the tests, the benchmark and `kgen tune`
(DESIGN §6): fresh random normals (never zeros); a request's prefix pages are scattered over the
pool by a random permutation, and every slot no prefix token uses holds NaN, so reading a slot
outside a request's prefix (even one that the softmax then masks) shows up in the output.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import torch

from . import fp8, reference
from .mask import mask_from_dense, mask_from_parents
from .spec import Spec

TREE_KINDS = ("random", "chain", "star", "bits")  # "bits": arbitrary visibility bits, not a tree


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


@dataclass(frozen=True)
class Dims:
    """The sizes inputs are made for: a spec's, or hand-picked ones (small CPU tests)."""

    num_heads: int
    head_dim: int = 576
    value_dim: int = 512
    scale: float = 0.0625
    max_nodes: int = 64
    page_size: int = 1
    parents: tuple[int, ...] | None = None  # a static tree: every request has exactly this tree
    kv_dtype: str = "bfloat16"
    mma: str = "bf16"  # the attention MMAs' input type (spec.cache.mma_type)
    scales: str = "per_tensor"  # an fp8 cache's scales: one kv_scale, or per 128-dim block (DSA pool rows)

    @classmethod
    def of(cls, spec_or_dims: Spec | Dims) -> Dims:
        if isinstance(spec_or_dims, Dims):
            return spec_or_dims
        m, tree = spec_or_dims.model, spec_or_dims.tree
        c = spec_or_dims.cache
        return cls(m.num_q_heads, m.head_dim, m.value_dim, m.softmax_scale, tree.nodes, c.page_size, tree.parents,
                   c.kv_dtype, c.mma_type, c.scales or "per_tensor")

    @property
    def mask_words(self) -> int:
        return (self.max_nodes + 31) // 32


@dataclass
class VerifyInputs:
    """One batch of verify inputs in the DESIGN §5 layout, plus what made them."""

    q: torch.Tensor  # [sum T, H, D] bf16
    kv_cache: torch.Tensor  # [num_slots, D] bf16, or e4m3 meaning byte * kv_scale, or uint8 DSA pool rows
    k_tree: torch.Tensor  # [sum T, D] bf16 (an fp8 op quantizes it with kv_scale, or to DSA pool rows)
    qo_indptr: torch.Tensor  # [B + 1] int32
    kv_indptr: torch.Tensor  # [B + 1] int32, in pages
    kv_indices: torch.Tensor  # [sum pages] int32
    kv_lens: torch.Tensor  # [B] int32
    tree_mask: torch.Tensor  # [sum T, words] int32 (also for a static tree, for the reference)
    parents: torch.Tensor | None  # [B, max T] parents the mask came from; None for "bits" masks
    page_size: int
    scale: float
    value_dim: int
    static_tree: bool  # the op takes tree_mask=None: the mask is compiled in
    kv_scale: float = 1.0

    @property
    def kv_fp8(self) -> bool:
        return self.kv_cache.dtype == fp8.E4M3

    @property
    def kv_scaled(self) -> bool:
        """The cache holds the DSA pool's rows (uint8, per-block scales)."""
        return self.kv_cache.dtype == torch.uint8

    @property
    def ref_k_tree(self) -> torch.Tensor:
        """The tree keys the op attends to: an fp8 op sees them quantized like the cache (the
        reference reads uint8 rows as DSA pool rows)."""
        stored = self.stored_k_tree
        return fp8.dequantize(stored, self.kv_scale) if self.kv_fp8 else stored

    @property
    def stored_k_tree(self) -> torch.Tensor:
        """The tree keys as the cache stores them, which is what a server passes an fp8 op: SGLang's
        pool writer stores the tree tokens' rows before attention runs and kgen's backends gather
        them (a bf16 k_tree costs the op a quantize, ~10 torch launches for DSA rows)."""
        if self.kv_scaled:
            return fp8.quantize_rows(self.k_tree, self.value_dim) if self.k_tree.dtype == torch.bfloat16 else self.k_tree
        return fp8.quantize(self.k_tree, self.kv_scale) if self.kv_fp8 else self.k_tree

    def to_fp8(self, kv_scale: float) -> VerifyInputs:
        """The same batch with the cache stored as e4m3 bytes of value / kv_scale (unused slots stay NaN)."""
        return replace(self, kv_cache=fp8.quantize(self.kv_cache, kv_scale), kv_scale=kv_scale)

    def stored_as(self, dims: Dims, kv_scale: float = 1.0) -> VerifyInputs:
        """The batch (made with a bf16 cache) with its cache in `dims`' format: bf16, e4m3 bytes of
        value / kv_scale, or DSA pool rows (kv_scale must then be 1)."""
        if dims.kv_dtype != "float8_e4m3fn":
            return self
        return self.to_scaled_rows() if dims.scales == "per_block" else self.to_fp8(kv_scale)

    def to_scaled_rows(self) -> VerifyInputs:
        """The same batch with the cache stored as DSA pool rows (unused slots stay NaN)."""
        return replace(self, kv_cache=fp8.quantize_rows(self.kv_cache, self.value_dim))

    @property
    def op_mask(self) -> torch.Tensor | None:
        return None if self.static_tree else self.tree_mask

    @property
    def kv_kwargs(self) -> dict:
        """Keyword arguments every attention op call on these inputs needs."""
        return {"kv_scale": self.kv_scale}

    def verify_args(self, *, stored_tree: bool = False) -> tuple:
        """verify_attention's tensors; `stored_tree`: the tree keys as the cache stores them."""
        return (self.q, self.kv_cache, self.stored_k_tree if stored_tree else self.k_tree, self.qo_indptr,
                self.kv_indptr, self.kv_indices, self.kv_lens, self.op_mask)

    def prefix_args(self) -> tuple:
        return self.q, self.kv_cache, self.qo_indptr, self.kv_indptr, self.kv_indices, self.kv_lens

    def tree_args(self, *, stored_tree: bool = False) -> tuple:
        return self.q, self.stored_k_tree if stored_tree else self.k_tree, self.qo_indptr, self.op_mask

    def verify_ref(self):
        return reference.verify_attention_ref(self.q, self.kv_cache, self.ref_k_tree, self.qo_indptr, self.kv_indptr,
                                              self.kv_indices, self.kv_lens, self.tree_mask, self.page_size,
                                              self.scale, self.value_dim, self.kv_scale)

    def prefix_ref(self):
        return reference.prefix_attention_ref(*self.prefix_args(), self.page_size, self.scale, self.value_dim,
                                              self.kv_scale)

    def tree_ref(self):
        return reference.tree_attention_ref(self.q, self.ref_k_tree, self.qo_indptr, self.tree_mask, self.scale,
                                            self.value_dim)

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Poisoned (out [sum T, H, Dv] bf16, lse [sum T, H] float32) to pass as out=/lse=."""
        t, h, _ = self.q.shape
        out = torch.empty(t, h, self.value_dim, dtype=torch.bfloat16, device=self.q.device)
        lse = torch.empty(t, h, dtype=torch.float32, device=self.q.device)
        return poison_(out), poison_(lse)


def tree_parents(kind: str, batch: int, nodes: int, *, generator: torch.Generator, device) -> torch.Tensor:
    """[batch, nodes] parent indices, parents before children: "random" (each node's parent drawn
    uniformly from the nodes before it), "chain" (i - 1) or "star" (all hang off the root)."""
    i = torch.arange(nodes, device=device)
    if kind == "chain":
        parents = (i - 1).expand(batch, nodes)
    elif kind == "star":
        parents = torch.where(i > 0, 0, -1).expand(batch, nodes)
    elif kind == "random":
        parents = (torch.rand(batch, nodes, generator=generator, device=device) * i).long()
        parents[:, :1] = -1
    else:
        raise ValueError(f"tree kind must be one of random, chain, star; got {kind!r}")
    return parents.contiguous()


def _indptr(sizes: list[int], device) -> torch.Tensor:
    return torch.tensor([0, *sizes], device=device).cumsum(0).to(torch.int32)


def make_verify_inputs(spec_or_dims: Spec | Dims, tree_sizes: list[int], prefix_lens: list[int], *,
                       page_size: int | None = None, tree_kind: str = "random", device="cpu",
                       generator: torch.Generator | None = None, num_pages: int | None = None,
                       unused_fill: float = float("nan")) -> VerifyInputs:
    """Random verify inputs for len(tree_sizes) requests: request b has tree_sizes[b] tree tokens
    and prefix_lens[b] prefix tokens. The pool has num_pages pages (default: the pages needed plus
    a quarter, at least 2, unused); prefix pages are a random permutation of them and slots that
    hold no prefix token are set to unused_fill. A static-tree spec always uses its own tree. An
    fp8 spec gets the cache quantized with a random kv_scale in [1/4, 4] (see VerifyInputs.to_fp8).
    `generator` must live on `device` (default: a fresh one seeded from os.urandom)."""
    dims = Dims.of(spec_or_dims)
    page = page_size or dims.page_size
    tree_sizes, prefix_lens = list(tree_sizes), list(prefix_lens)
    if len(tree_sizes) != len(prefix_lens):
        raise ValueError(f"tree_sizes has {len(tree_sizes)} requests but prefix_lens has {len(prefix_lens)}")
    if any(not 0 <= t <= dims.max_nodes for t in tree_sizes):
        raise ValueError(f"tree sizes must be in 0..{dims.max_nodes}, got {tree_sizes}")
    if dims.parents is not None and any(t != len(dims.parents) for t in tree_sizes):
        raise ValueError(f"a static tree has {len(dims.parents)} nodes per request, got tree_sizes {tree_sizes}")
    device = torch.device(device)
    g = generator or torch.Generator(device).manual_seed(fresh_seed())
    batch, sum_t, n = len(tree_sizes), sum(tree_sizes), max(tree_sizes, default=0)

    pages_per_request = [math.ceil(length / page) for length in prefix_lens]
    used_pages = sum(pages_per_request)
    pool = num_pages if num_pages is not None else used_pages + max(2, used_pages // 4)
    if pool < used_pages:
        raise ValueError(f"num_pages {pool} < the {used_pages} pages the prefixes need")
    kv_indices = torch.randperm(pool, generator=g, device=device)[:used_pages].to(torch.int32)
    kv_indptr = _indptr(pages_per_request, device)
    kv_lens = torch.tensor(prefix_lens, dtype=torch.int32, device=device)
    kv_cache = torch.randn(pool * page, dims.head_dim, generator=g, device=device, dtype=torch.bfloat16)
    lens = kv_lens.long()
    req = torch.repeat_interleave(torch.arange(batch, device=device), lens)
    t = torch.arange(req.numel(), device=device) - (lens.cumsum(0) - lens)[req]
    used_slots = kv_indices.long()[kv_indptr.long()[req] + t // page] * page + t % page
    unused = torch.ones(pool * page, dtype=torch.bool, device=device)
    unused[used_slots] = False
    kv_cache[unused] = unused_fill

    counts = torch.tensor(tree_sizes, device=device)
    if dims.parents is not None:
        parents = torch.tensor(dims.parents, device=device).expand(batch, n).contiguous()
    elif tree_kind == "bits":
        parents = None
        own = torch.arange(n, device=device) < torch.repeat_interleave(counts, counts).unsqueeze(1)
        dense = (torch.rand(sum_t, n, generator=g, device=device) < 0.5) & own
        tree_mask = mask_from_dense(dense, dims.mask_words)
    else:
        parents = tree_parents(tree_kind, batch, n, generator=g, device=device)
    if parents is not None:
        tree_mask = mask_from_parents(parents, counts, words=dims.mask_words)

    inputs = VerifyInputs(
        q=torch.randn(sum_t, dims.num_heads, dims.head_dim, generator=g, device=device, dtype=torch.bfloat16),
        kv_cache=kv_cache,
        k_tree=torch.randn(sum_t, dims.head_dim, generator=g, device=device, dtype=torch.bfloat16),
        qo_indptr=_indptr(tree_sizes, device), kv_indptr=kv_indptr, kv_indices=kv_indices, kv_lens=kv_lens,
        tree_mask=tree_mask, parents=parents, page_size=page, scale=dims.scale, value_dim=dims.value_dim,
        static_tree=dims.parents is not None)
    if dims.kv_dtype == "float8_e4m3fn" and dims.scales == "per_block":
        return block_magnitudes(inputs, g).to_scaled_rows()
    if dims.kv_dtype == "float8_e4m3fn":
        return inputs.to_fp8(4.0 ** (2 * torch.rand((), generator=g, device=device).item() - 1))
    return inputs


def block_magnitudes(inputs: VerifyInputs, generator: torch.Generator) -> VerifyInputs:
    """The batch with every key row's 128-dim latent blocks and its rope each scaled by its own
    random magnitude 2^u, u uniform in [-3, 0]: block scales up to 8x apart within a row and between
    rows, as a DSA pool's are, and logits no larger than unit normals give (so e4m3 MMAs keep the
    error their tolerance documents)."""
    def scaled(k: torch.Tensor) -> torch.Tensor:
        blocks = inputs.value_dim // 128
        widths = [128] * blocks + [k.shape[1] - inputs.value_dim]
        m = 2.0 ** (-3 * torch.rand(k.shape[0], blocks + 1, generator=generator, device=k.device))
        return (k.float() * torch.repeat_interleave(m, torch.tensor(widths, device=k.device), dim=1)).bfloat16()
    return replace(inputs, kv_cache=scaled(inputs.kv_cache), k_tree=scaled(inputs.k_tree))


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill t in place with NaN (floating point) or its dtype's minimum (integers); returns t."""
    return t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).min)


def is_poison(t: torch.Tensor) -> torch.Tensor:
    return torch.isnan(t) if t.is_floating_point() else t == torch.iinfo(t.dtype).min
