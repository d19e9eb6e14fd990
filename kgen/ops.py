"""The ops of DESIGN §5 on one GPU: kgen.jit(spec) returns a Module.

Every op launches on torch.cuda.current_stream(), allocates only through torch, never syncs
with the host (unless KGEN_VALIDATE=1) and so can be captured in a CUDA graph: all launch
sizes derive from tensor shapes, and each attention CTA finds its split-KV work item on the
device (templates/schedule.cuh).
"""

from __future__ import annotations

import os

import torch

from . import checks, fp8
from .arch import arch_for_capability
from .build import build
from .plan import MIN_SPLIT_TILES, AttentionTiles, Plan, ceil_div, plan, work_capacity
from .runtime import Kernel
from .spec import Spec

DEFRAG_STAGING_BYTES = int(os.environ.get("KGEN_DEFRAG_STAGING_BYTES", 1 << 30))


def _validate() -> bool:
    return os.environ.get("KGEN_VALIDATE", "") not in ("", "0")


class Module:
    def __init__(self, spec: Spec, device: torch.device | str | None = None, tiles: AttentionTiles | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("kgen.jit needs a CUDA GPU (torch.cuda.is_available() is False)")
        self.device = torch.device(device or "cuda")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.spec = spec
        self.plan: Plan = plan(spec, tiles=tiles)  # the spec's target plan, compiled for the GPU present
        props = torch.cuda.get_device_properties(self.device)
        self.arch = arch_for_capability(props.major, props.minor)
        self.sm_count = props.multi_processor_count
        self.built = build(self.plan, [self.arch.name])
        self.k = {b.variant.name: Kernel(b, self.device) for b in self.built}
        self._layer_tables: dict[tuple[int, ...], torch.Tensor] = {}

    # ---- attention -------------------------------------------------------------------------

    # An fp8 spec's KV rows are e4m3 bytes meaning byte * kv_scale; tree keys may come in bf16 (as
    # SGLang passes the new tokens' k) and are then quantized with the same scale.

    def prefix_attention(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, *, kv_scale=1.0,
                         out=None, lse=None):
        """Attention of the tree tokens against their paged prefixes only."""
        return self._attention(q, qo_indptr, out, lse, kv_scale, prefix=(kv_cache, kv_indptr, kv_indices, kv_lens))

    def tree_attention(self, q, k_tree, qo_indptr, tree_mask, *, kv_scale=1.0, out=None, lse=None):
        """Attention of the tree tokens against each other under the tree mask only."""
        return self._attention(q, qo_indptr, out, lse, kv_scale, tree=(k_tree, tree_mask))

    def verify_attention(self, q, kv_cache, k_tree, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, *,
                         kv_scale=1.0, out=None, lse=None):
        """Prefix + tree attention of every tree token: merge(prefix_attention, tree_attention)."""
        return self._attention(q, qo_indptr, out, lse, kv_scale, prefix=(kv_cache, kv_indptr, kv_indices, kv_lens),
                               tree=(k_tree, tree_mask))

    @property
    def kv_fp8(self) -> bool:
        return self.spec.cache.kv_dtype == "float8_e4m3fn"

    def _attention(self, q, qo_indptr, out, lse, kv_scale, prefix=None, tree=None):
        m, dev = self.spec.model, self.device
        kv_scale = fp8.check_scale(kv_scale)
        if not self.kv_fp8 and kv_scale != 1.0:
            raise ValueError(f"kv_scale: {self.spec.name} has a {self.spec.cache.kv_dtype} KV cache; kv_scale "
                             f"applies to float8_e4m3fn caches only (got {kv_scale})")
        kv_dtype = fp8.E4M3 if self.kv_fp8 else torch.bfloat16
        q = checks.tensor("q", q, dtype=torch.bfloat16, device=dev, shape=(None, m.num_q_heads, m.head_dim))
        total = q.shape[0]
        qo_indptr = checks.indptr("qo_indptr", qo_indptr, length=None, device=dev)
        batch = qo_indptr.numel() - 1
        out = checks.out_tensor("out", out, shape=(total, m.num_q_heads, m.value_dim), dtype=torch.bfloat16, device=dev)
        lse = checks.out_tensor("lse", lse, shape=(total, m.num_q_heads), dtype=torch.float32, device=dev)
        if prefix is not None:
            kv_cache, kv_indptr, kv_indices, kv_lens = prefix
            kv_cache = checks.kv_rows("kv_cache", kv_cache, dtype=kv_dtype, device=dev, width=m.head_dim)
            kv_indptr = checks.indptr("kv_indptr", kv_indptr, length=batch + 1, device=dev)
            kv_indices = checks.tensor("kv_indices", kv_indices, dtype=torch.int32, device=dev, ndim=1)
            kv_lens = checks.tensor("kv_lens", kv_lens, dtype=torch.int32, device=dev, shape=(batch,))
        else:
            kv_lens = torch.zeros(batch, dtype=torch.int32, device=dev)
        if tree is not None:
            k_tree, tree_mask = tree
            tree_dtypes = (torch.bfloat16, fp8.E4M3) if self.kv_fp8 else torch.bfloat16
            k_tree = checks.kv_rows("k_tree", k_tree, dtype=tree_dtypes, device=dev, width=m.head_dim, rows=total)
            if k_tree.dtype != kv_dtype:
                k_tree = fp8.quantize(k_tree, kv_scale)
            tree_mask = self._check_tree_mask(tree_mask, total, batch)
        if total == 0 or batch == 0:
            return out, lse

        validate = _validate()
        error = torch.zeros(1, dtype=torch.int32, device=dev)
        target = self.sm_count * self.plan.tiles.min_blocks  # one wave of attention CTAs
        prefix_items, tree_items = work_capacity(self.plan, total, batch, target)
        grid = prefix_items if prefix is not None else tree_items  # one CTA per possible work item
        req_meta = torch.empty(batch, 4, dtype=torch.int32, device=dev)
        # Verify and tree-only calls give every request at least one split: verify's tree rides on
        # each row tile's last split, tree-only has one item per row tile (all kv_lens 0).
        schedule = dict(qo_indptr=qo_indptr, kv_lens=kv_lens, batch=batch, target_ctas=target,
                        min_split_tiles=MIN_SPLIT_TILES, min_splits=int(tree is not None),
                        max_nodes=self.spec.tree.nodes if tree is not None else total, total_tokens=total,
                        validate=int(validate), error_flag=error, req_meta=req_meta)

        bm, dv = self.plan.tiles.bm, m.value_dim
        part_o = torch.empty(grid * bm, dv, dtype=torch.float32, device=dev)
        part_lse = torch.empty(grid * bm, dtype=torch.float32, device=dev)
        mask_ptr = (tree_mask if tree_mask is not None else 0) if tree is not None else None
        if prefix is not None:
            args = dict(q=q, kv_cache=kv_cache, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_scale=kv_scale,
                        part_o=part_o, part_lse=part_lse, num_slots=kv_cache.shape[0], **schedule)
            if tree is not None:
                self.k["verify_attn"](grid, **args, k_tree=k_tree, tree_mask=mask_ptr)
            else:
                self.k["prefix_attn"](grid, **args)
        else:
            self.k["tree_attn"](grid, q=q, k_tree=k_tree, kv_scale=kv_scale, tree_mask=mask_ptr, part_o=part_o,
                                part_lse=part_lse, **schedule)
        self.k["lse_combine"](total * m.num_q_heads, part_o=part_o, part_lse=part_lse, qo_indptr=qo_indptr,
                              req_meta=req_meta, batch=batch, o=out, lse=lse)
        if validate:
            self._raise_device_errors(error, prefix is not None)
        return out, lse

    def _check_tree_mask(self, tree_mask, total: int, batch: int):
        t = self.spec.tree
        if t.is_static:
            if tree_mask is not None:
                raise ValueError(f"tree_mask: spec {self.spec.name} has a static tree compiled in; pass None")
            if total != batch * t.nodes:
                raise ValueError(f"q: a static tree of {t.nodes} nodes needs {batch} x {t.nodes} tokens, got {total}")
            return None
        if isinstance(tree_mask, torch.Tensor) and tree_mask.dim() == 2 and tree_mask.shape[1] < t.mask_words:
            raise ValueError(f"tree_mask: {tree_mask.shape[1]} int32 words per row are narrower than max_nodes "
                             f"{t.nodes} needs ({t.mask_words})")
        return checks.tensor("tree_mask", tree_mask, dtype=torch.int32, device=self.device,
                             shape=(total, t.mask_words))

    @staticmethod
    def _raise_device_errors(error: torch.Tensor, has_prefix: bool) -> None:
        flag = int(error.item())  # KGEN_VALIDATE=1 is a debug mode: the sync is expected
        if flag & 1:
            raise ValueError(f"qo_indptr/kv_lens: a request has a negative length, more tree tokens than the "
                             f"spec's max_nodes, or qo_indptr does not run from 0 to the number of tokens (KGEN_VALIDATE)")
        if flag & 2 and has_prefix:
            raise ValueError("kv_indices/kv_lens: a prefix token maps outside its request's pages or outside "
                             "kv_cache (KGEN_VALIDATE)")

    # ---- merge ----------------------------------------------------------------------------

    def merge_states(self, o_a, lse_a, o_b, lse_b, *, out=None, lse=None):
        """Merge two attention states of the same rows as if their key sets were united."""
        dev = self.device
        if not isinstance(o_a, torch.Tensor):
            raise TypeError(f"o_a: expected a torch.Tensor, got {type(o_a).__name__}")
        if o_a.dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"o_a: expected dtype torch.bfloat16 or torch.float32, got {o_a.dtype}")
        shape = tuple(o_a.shape)
        if len(shape) < 2 or shape[-1] % 8:
            raise ValueError(f"o_a: expected [..., width] with width a multiple of 8, got shape {shape}")
        o_a = checks.tensor("o_a", o_a, dtype=o_a.dtype, device=dev, shape=shape)
        o_b = checks.tensor("o_b", o_b, dtype=o_a.dtype, device=dev, shape=shape)
        lse_a = checks.tensor("lse_a", lse_a, dtype=torch.float32, device=dev, shape=shape[:-1])
        lse_b = checks.tensor("lse_b", lse_b, dtype=torch.float32, device=dev, shape=shape[:-1])
        out = checks.out_tensor("out", out, shape=shape, dtype=o_a.dtype, device=dev)
        lse = checks.out_tensor("lse", lse, shape=shape[:-1], dtype=torch.float32, device=dev)
        rows = lse_a.numel()
        vecs = rows * (shape[-1] // 8)
        kernel = self.k["lse_merge_bf16" if o_a.dtype == torch.bfloat16 else "lse_merge_f32"]
        kernel(min(ceil_div(vecs, kernel.variant.threads), self.sm_count * 16),
               o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b, o=out, lse=lse, rows=rows, width=shape[-1])
        return out, lse

    # ---- defrag ---------------------------------------------------------------------------

    def defrag(self, kv_caches, src, dst) -> None:
        """For every layer and n: cache[dst[n]] = old cache[src[n]] (reads before writes)."""
        layers, num_slots, row_bytes = self._layer_table(kv_caches)
        if row_bytes % 16:
            raise ValueError(f"kv_caches: a row is {row_bytes} bytes; rows must be a multiple of 16 bytes")
        src = self._move_index("src", src)
        dst = self._move_index("dst", dst)
        if src.numel() != dst.numel():
            raise ValueError(f"src/dst: expected the same number of moves, got {src.numel()} and {dst.numel()}")
        n = src.numel()
        if n == 0:
            return
        if _validate():
            self._validate_moves(src, dst, num_slots)
        is_dst = torch.zeros(num_slots, dtype=torch.uint8, device=self.device)
        is_dst.index_fill_(0, dst, 1)  # a scalar fill: no host-to-device copy (graph capture)
        num_layers = layers.numel()
        row_chunks = row_bytes // 16
        group = max(1, min(num_layers, DEFRAG_STAGING_BYTES // max(1, n * row_bytes)))
        staging = torch.empty(group * n * row_chunks, 4, dtype=torch.int32, device=self.device)
        kernel = self.k["kv_defrag"]
        grid = min(ceil_div(n * row_chunks, kernel.variant.threads), self.sm_count * 8)
        for first in range(0, num_layers, group):  # one launch pair for all layers unless staging is capped
            part = layers[first:first + group]
            for phase in (0, 1):
                kernel(grid, layers=part, src=src, dst=dst, is_dst=is_dst, staging=staging, n=n,
                       num_layers=part.numel(), row_chunks=row_chunks, phase=phase)

    def _layer_table(self, kv_caches) -> tuple[torch.Tensor, int, int]:
        """Device array of per-layer base addresses, slots per layer, bytes per row."""
        if isinstance(kv_caches, torch.Tensor):
            c = checks.tensor("kv_caches", kv_caches, dtype=kv_caches.dtype, device=self.device, ndim=kv_caches.dim())
            if c.dim() not in (3, 4) or (c.dim() == 4 and c.shape[2] != 1):
                raise ValueError(f"kv_caches: expected [layers, slots, D] (or [layers, slots, 1, D]), got {tuple(c.shape)}")
            row_bytes = c.shape[-1] * c.element_size()
            stride = c.stride(0) * c.element_size()
            table = c.data_ptr() + stride * torch.arange(c.shape[0], device=self.device, dtype=torch.int64)
            return table, c.shape[1], row_bytes
        if not isinstance(kv_caches, (list, tuple)) or not kv_caches:
            raise TypeError("kv_caches: expected a stacked [layers, slots, D] tensor or a non-empty list of tensors")
        first = kv_caches[0]
        if not isinstance(first, torch.Tensor):
            raise TypeError(f"kv_caches[0]: expected a torch.Tensor, got {type(first).__name__}")
        for i, c in enumerate(kv_caches):
            checks.tensor(f"kv_caches[{i}]", c, dtype=first.dtype, device=self.device, shape=tuple(first.shape))
        key = tuple(c.data_ptr() for c in kv_caches)
        if key not in self._layer_tables:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("defrag: call it once with this list of layers before capturing a CUDA graph "
                                   "(its address table is uploaded on first use), or pass a stacked tensor")
            self._layer_tables[key] = torch.tensor(key, dtype=torch.int64).to(self.device)
        return self._layer_tables[key], first.shape[0], first[0].numel() * first.element_size()

    def _move_index(self, name: str, t) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}")
        return t.to(device=self.device, dtype=torch.int64).contiguous()

    @staticmethod
    def _validate_moves(src: torch.Tensor, dst: torch.Tensor, num_slots: int) -> None:
        for name, t in (("src", src), ("dst", dst)):
            if bool(((t < 0) | (t >= num_slots)).any()):
                raise ValueError(f"{name}: slot index outside [0, {num_slots}) (KGEN_VALIDATE)")
        if torch.unique(dst).numel() != dst.numel():
            raise ValueError("dst: slots must be distinct (KGEN_VALIDATE)")
