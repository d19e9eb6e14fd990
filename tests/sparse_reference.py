"""`ReferenceModule`: a stand-in for a compiled kgen module of a sparse spec, whose
`sparse_verify_attention` is kgen.reference's DESIGN §12 reference, so the SGLang side can be
tested where the kernel cannot run; and `dequantize_rows`, cache rows as SGLang's pool holds them
(bf16 [slots, (1,) 576], or the 656-byte DSA rows, uint8 or float8-typed) read as float64.
"""

from __future__ import annotations

import types

import torch

from kgen.reference import dequantize_scaled_rows, sparse_verify_attention_ref

LATENT, ROPE, BLOCK = 512, 64, 128
ROW_BYTES = LATENT + 4 * (LATENT // BLOCK) + 2 * ROPE  # 656


def pool_rows(rows: torch.Tensor) -> torch.Tensor:
    """[n, (1,) width] rows as kgen reads them: SGLang's float8-typed 656-byte rows as uint8."""
    rows = rows.reshape(rows.shape[0], -1)
    if rows.dtype == torch.float8_e4m3fn and rows.shape[1] == ROW_BYTES:
        rows = rows.view(torch.uint8)
    if rows.dtype == torch.uint8 and rows.shape[1] != ROW_BYTES:
        raise ValueError(f"fp8 rows must be {ROW_BYTES} bytes wide, got {rows.shape[1]}")
    return rows


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """Cache rows [n, (1,) width] -> [n, 576] float64: bf16 as given, 656-byte rows dequantized."""
    rows = pool_rows(rows)
    return dequantize_scaled_rows(rows, LATENT) if rows.dtype == torch.uint8 else rows.double()


class ReferenceStep:
    """A stand-in for a prepared sparse step: it keeps the metadata tensors (not their values, as
    kgen's does) and runs each layer through its module's reference call."""

    def __init__(self, module, qo_indptr, topk_indices, tree_mask, workspace):
        self.module, self.qo_indptr, self.topk_indices, self.tree_mask = module, qo_indptr, topk_indices, tree_mask
        self.workspace = workspace
        self.reschedules = 0

    def reschedule(self) -> None:
        self.reschedules += 1

    def verify(self, q, kv_cache, k_tree, *, kv_scale=1.0, out=None, lse=None):
        return self.module.sparse_verify_attention(q, kv_cache, k_tree, self.qo_indptr, self.topk_indices,
                                                   self.tree_mask, out=out, lse=lse)


class ReferenceModule:
    """A stand-in for kgen.jit of a sparse spec: the spec fields kgen's SGLang DSA backend reads,
    sparse_verify_attention computed by kgen.reference (recording each call) and prepared steps
    over it (recorded too)."""

    def __init__(self, *, heads: int, index_topk: int, max_nodes: int, scale: float, kv_dtype: str = "bfloat16",
                 page_size: int = 64, device="cpu"):
        self.device = torch.device(device)
        self.spec = types.SimpleNamespace(
            name="reference_sparse",
            model=types.SimpleNamespace(num_q_heads=heads, head_dim=LATENT + ROPE, value_dim=LATENT,
                                        softmax_scale=scale, index_topk=index_topk),
            cache=types.SimpleNamespace(kv_dtype=kv_dtype, page_size=page_size),
            tree=types.SimpleNamespace(nodes=max_nodes, mask_words=(max_nodes + 31) // 32))
        self.calls: list[dict] = []
        self.steps: list[ReferenceStep] = []

    def prepare_sparse(self, qo_indptr, topk_indices, tree_mask=None, *, workspace=None):
        self.steps.append(ReferenceStep(self, qo_indptr, topk_indices, tree_mask, workspace))
        return self.steps[-1]

    def sparse_workspace_bytes(self, num_tokens: int, batch: int) -> int:
        return 256 * (num_tokens + batch)

    def sparse_verify_attention(self, q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask, out=None, lse=None):
        self.calls.append(dict(topk_indices=topk_indices.clone(), tree_mask=tree_mask.clone()))
        o, row_lse = sparse_verify_attention_ref(q, pool_rows(kv_cache), pool_rows(k_tree), qo_indptr, topk_indices,
                                                 tree_mask, self.spec.model.softmax_scale)
        if out is None:
            out = torch.empty(o.shape, dtype=q.dtype, device=q.device)
        out.copy_(o)
        if lse is not None:
            lse.copy_(row_lse)
        return out, row_lse.float() if lse is None else lse
