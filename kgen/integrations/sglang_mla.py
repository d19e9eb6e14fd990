"""kgen's half of the SGLang backend (kgen/integrations/sglang.py): SGLang's metadata, as its
Triton backend is given it, turned into kgen's inputs on the device, and a layer's KV scale.
Imports nothing of SGLang (tests/test_sglang_meta.py runs it without SGLang)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from .. import fp8
from ..mask import mask_from_parents, mask_from_sglang


@dataclass
class Meta:
    """One step's kgen inputs (DESIGN §5 layout, page size 1)."""

    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32, slots = pages
    kv_indices: torch.Tensor  # [>= sum L] int32 slots
    kv_lens: torch.Tensor  # [B] int32
    tree_mask: torch.Tensor | None  # [B*N, words] int32; None for decode


Fill = Callable[[torch.Tensor, torch.Tensor], None]  # fill(kv_indptr, out): token slots of every prefix


class KgenMLA:
    """kgen's half of the backend: builds kgen's inputs from what SGLang's Triton backend is
    given, and reads a layer's KV scale. Needs no SGLang import (tests/test_sglang_meta.py)."""

    def __init__(self, module, max_context_len: int):
        self.module = module
        m, tree = module.spec.model, module.spec.tree
        self.heads, self.dim, self.vdim = m.num_q_heads, m.head_dim, m.value_dim
        self.scale, self.max_nodes, self.words = m.softmax_scale, tree.nodes, tree.mask_words
        self.kv_fp8 = module.spec.cache.kv_dtype == "float8_e4m3fn"
        self.kv_scaled = getattr(module.spec.cache, "scales", "per_tensor") == "per_block"
        self.max_context_len = max_context_len
        self.device = module.device
        self.graph: dict[str, torch.Tensor] | None = None
        self.workspace: torch.Tensor | None = None  # scratch the captured steps share (they replay in turn)
        self._chains: dict[int, torch.Tensor] = {}

    def init_graph(self, max_bs: int) -> None:
        """Address-stable buffers for CUDA-graph capture and replay (up to max_bs requests)."""
        z = functools.partial(torch.zeros, dtype=torch.int32, device=self.device)
        self.graph = dict(qo_indptr=z(max_bs + 1), kv_indptr=z(max_bs + 1), kv_lens=z(max_bs),
                          kv_indices=z(max_bs * self.max_context_len), tree_mask=z(max_bs * self.max_nodes, self.words))
        self.workspace = torch.empty(self.module.workspace_bytes(max_bs * self.max_nodes, max_bs), dtype=torch.uint8,
                                     device=self.device)

    def prepare(self, meta: Meta, num_tokens: int, *, graph: bool = False):
        """kgen's prepared step for one batch (its metadata checked once; run per layer). A graph
        step uses the shared workspace."""
        return self.module.prepare(meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_lens, meta.tree_mask,
                                   num_tokens=num_tokens, workspace=self.workspace if graph else None)

    def chain_mask(self, n: int) -> torch.Tensor:
        """[n, words]: node i sees nodes 0..i (SGLang's causal verify when it passes no custom_mask)."""
        if n not in self._chains:
            parents = torch.arange(-1, n - 1, device=self.device).unsqueeze(0)
            self._chains[n] = mask_from_parents(parents, words=self.words)
        return self._chains[n]

    def plan(self, seq_lens: torch.Tensor, fill: Fill, *, tokens_per_req: int, verify: bool,
             custom_mask: torch.Tensor | None = None, capacity: int | None = None, graph: bool = False) -> Meta:
        """kgen inputs for a batch of len(seq_lens) requests of `tokens_per_req` query tokens each.

        seq_lens: the prefix lengths SGLang gives the Triton backend (verify: without the tree
        tokens; decode: with the current token, whose KV the layer writes before attending).
        fill: writes each request's token slots (int32) into kv_indices at kv_indptr.
        custom_mask: SGLang's flat verify mask (per request [N, L + N], row-major) or None.
        graph: write into the init_graph buffers (capture / replay) instead of new tensors."""
        bs, n = seq_lens.numel(), tokens_per_req
        if verify and n > self.max_nodes:
            raise ValueError(f"{n} draft tokens per request exceed the kgen spec's max_nodes {self.max_nodes}")
        seq = seq_lens.to(torch.int32)
        qo = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=self.device)
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        indptr[1:] = torch.cumsum(seq, 0)
        mask = None
        if verify:
            mask = (mask_from_sglang(custom_mask, seq_lens, n, self.words) if custom_mask is not None
                    else self.chain_mask(n).repeat(bs, 1))
        if graph:
            g = self.graph
            if g is None:
                raise RuntimeError("KgenMLA.plan(graph=True) before init_graph()")
            g["qo_indptr"][:bs + 1].copy_(qo)
            g["kv_indptr"][:bs + 1].copy_(indptr)
            g["kv_lens"][:bs].copy_(seq)
            qo, indptr, seq, indices = g["qo_indptr"][:bs + 1], g["kv_indptr"][:bs + 1], g["kv_lens"][:bs], g["kv_indices"]
            if mask is not None:
                g["tree_mask"][:bs * n].copy_(mask)
                mask = g["tree_mask"][:bs * n]
        else:
            indices = torch.empty(capacity if capacity is not None else bs * self.max_context_len,
                                  dtype=torch.int32, device=self.device)
        fill(indptr, indices)
        return Meta(qo, indptr, indices, seq, mask)

    def kv_scale(self, layer) -> float | None:
        """The scale this layer's cache is read with (kgen's kv_scale), or None when kgen cannot read
        it as SGLang does: SGLang reads keys times k_scale and values times v_scale, kgen has one
        scale for the one latent row, and a bf16 cache is read unscaled. Scaled rows carry their
        own scales (SGLang's writer for them ignores the layer's)."""
        k_scale, v_scale = layer.k_scale, layer.v_scale
        if self.kv_scaled or (k_scale is None and v_scale is None):
            return 1.0
        if not self.kv_fp8 or k_scale is None or v_scale is None:
            return None
        k, v = float(layer.k_scale_float), float(layer.v_scale_float)
        try:
            return fp8.check_scale(k) if k == v else None
        except ValueError:  # not a scale kgen's ops accept (inf, nan, <= 0): Triton's
            return None

    def serves(self, layer) -> bool:
        """The layer is the absorbed-MLA attention kgen was built for, without features kgen lacks."""
        return (layer.qk_head_dim == self.dim and layer.v_head_dim == self.vdim and layer.tp_q_head_num == self.heads
                and layer.tp_k_head_num == 1 and float(layer.scaling) == self.scale and not layer.logit_cap
                and (layer.sliding_window_size is None or layer.sliding_window_size < 0)
                and not layer.is_cross_attention and layer.xai_temperature_len <= 0)
