"""The per-layer KV arguments of an attention call (kv_cache, k_tree, kv_scale), checked for the
spec's cache format; dense steps (kgen/step.py) and sparse steps (kgen/sparse.py) share them.

An fp8 spec's KV rows are e4m3 bytes meaning byte * kv_scale; tree keys may come in bf16 (as
SGLang passes the new tokens' k) and are then quantized with the same scale. A per-block spec's
rows are the DSA pool's (DESIGN §11, kv_scale stays 1): bf16 tree keys are quantized to such rows
with the pool's own rule (fp8.quantize_rows), so the kernel reads one row format and a tree token
means the same as it will once SGLang has stored it in the pool; or pass the stored uint8 rows.
"""

from __future__ import annotations

import torch

from . import checks, fp8, kvrows
from .spec import Spec

_BF16 = (torch.bfloat16,)


class KVArgs:
    """What a spec's kernels read as kv_cache, k_tree and kv_scale."""

    def __init__(self, spec: Spec, device: torch.device):
        self.spec, self.device = spec, device
        self.width = spec.model.head_dim  # elements of a bf16 (or per-tensor e4m3) key row
        self.fp8 = spec.cache.kv_dtype == "float8_e4m3fn"
        self.scaled = spec.cache.per_block  # the DSA pool's rows: uint8 [slots, 656], scales inside
        self.row_width = kvrows.row_bytes(spec) if self.scaled else self.width
        if self.scaled:
            self.cache_dtypes, self.tree_dtypes = (torch.uint8,), (torch.bfloat16, torch.uint8)
        elif self.fp8:
            self.cache_dtypes, self.tree_dtypes = (fp8.E4M3,), (torch.bfloat16, fp8.E4M3)
        else:
            self.cache_dtypes, self.tree_dtypes = _BF16, _BF16

    def scale(self, kv_scale) -> float:
        kv_scale = fp8.check_scale(kv_scale)
        name, kv_dtype = self.spec.name, self.spec.cache.kv_dtype
        if not self.fp8 and kv_scale != 1.0:
            raise ValueError(f"kv_scale: {name} has a {kv_dtype} KV cache; kv_scale applies to "
                             f"float8_e4m3fn caches only (got {kv_scale})")
        if self.scaled and kv_scale != 1.0:
            raise ValueError(f"kv_scale: {name} reads the DSA pool's rows (cache.scales: per_block), which carry "
                             f"their own block scales; kv_scale applies to per-tensor fp8 caches only (got {kv_scale})")
        return kv_scale

    def cache(self, kv_cache) -> tuple[int, int]:
        """(device address, slots) of the layer's KV cache."""
        return checks.rows_address("kv_cache", kv_cache, dtypes=self.cache_dtypes, device=self.device,
                                   width=self.row_width)

    def tree(self, k_tree, rows: int, kv_scale: float) -> tuple[int, torch.Tensor]:
        """(device address, tensor) of the tree keys in the cache's row format; the caller holds the
        tensor until the launch has read it (it may be a quantized copy)."""
        in_cache_format = self.scaled and getattr(k_tree, "dtype", None) == torch.uint8
        address = checks.rows_address("k_tree", k_tree, dtypes=self.tree_dtypes, device=self.device,
                                      width=self.row_width if in_cache_format else self.width, rows=rows)[0]
        if not self.fp8 or k_tree.dtype != torch.bfloat16:
            return address, k_tree
        k_tree = (fp8.quantize_rows(k_tree, self.spec.model.kv_lora_rank) if self.scaled
                  else fp8.quantize(k_tree, kv_scale))
        return k_tree.data_ptr(), k_tree
