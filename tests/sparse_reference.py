"""DESIGN §12's sparse tree verify, written from the contract (not from any kernel), for the SGLang
DSA tests until kgen.reference has its own; and `ReferenceModule`, which stands in for a compiled
kgen module of a sparse spec (its `sparse_verify_attention` is this reference), so the SGLang side
can be tested where the kernel cannot run.

Row i of request b, head h: keys = the prefix slots listed in topk_indices[i] (!= -1) ∪ the tree
tokens j of b whose mask bit (i, j) is set; logits = scale·<q, key> over 576 dims, values = the
first 512 dims; a row without keys gets o = 0, lse = -inf. Cache rows are bf16 [slots, (1,) 576]
or the DSA pool's 656-byte fp8 rows (§11: 512 e4m3 latent bytes | 4 fp32 scales, scale k for latent
dims 128k..128k+127 | 64 bf16 rope values), read dequantized.
"""

from __future__ import annotations

import types

import torch

from kgen.reference import attend, tree_visibility

LATENT, ROPE, BLOCK = 512, 64, 128
ROW_BYTES = LATENT + 4 * (LATENT // BLOCK) + 2 * ROPE  # 656


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """Cache rows [n, (1,) width] -> [n, 576] float64: bf16 as given, 656-byte rows (uint8, or
    float8-typed as SGLang's pool holds them) dequantized."""
    rows = rows.reshape(rows.shape[0], -1)
    if rows.dtype == torch.float8_e4m3fn and rows.shape[1] == ROW_BYTES:  # SGLang's float8-typed 656-byte rows
        rows = rows.view(torch.uint8)
    if rows.dtype != torch.uint8:
        return rows.double()
    if rows.shape[1] != ROW_BYTES:
        raise ValueError(f"fp8 rows must be {ROW_BYTES} bytes wide, got {rows.shape[1]}")
    latent = rows[:, :LATENT].contiguous().view(torch.float8_e4m3fn).double()
    scales = rows[:, LATENT:LATENT + 16].contiguous().view(torch.float32).double()
    rope = rows[:, LATENT + 16:].contiguous().view(torch.bfloat16).double()
    latent = (latent.view(-1, LATENT // BLOCK, BLOCK) * scales.unsqueeze(-1)).view(-1, LATENT)
    return torch.cat([latent, rope], dim=1)


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[n, 576] -> 656-byte rows (a per-128-block scale of max|x| / 448), for building test caches."""
    x = x.float()
    latent = x[:, :LATENT].view(-1, LATENT // BLOCK, BLOCK)
    scales = (latent.abs().amax(-1) / 448).clamp_min(1e-8)
    q = (latent / scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8).view(-1, LATENT)
    rope = x[:, LATENT:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([q, scales.contiguous().view(torch.uint8), rope], dim=1)


def sparse_verify_ref(q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask, scale, value_dim=LATENT):
    """(o [ΣT, H, value_dim], lse [ΣT, H]) float64, per the semantics above."""
    sum_t, h, _ = q.shape
    o = torch.zeros(sum_t, h, value_dim, dtype=torch.float64, device=q.device)
    lse = torch.full((sum_t, h), float("-inf"), dtype=torch.float64, device=q.device)
    tree_keys = dequantize_rows(k_tree)
    qo = qo_indptr.tolist()
    for b in range(len(qo) - 1):
        s, e = qo[b], qo[b + 1]
        visible_tree = tree_visibility(tree_mask[s:e], e - s)
        for i in range(s, e):
            listed = topk_indices[i][topk_indices[i] >= 0].long()
            keys = torch.cat([dequantize_rows(kv_cache[listed]), tree_keys[s:e][visible_tree[i - s]]])
            seen = torch.ones(1, keys.shape[0], dtype=torch.bool, device=q.device)
            o[i:i + 1], lse[i:i + 1] = attend(q[i:i + 1], keys, seen, scale, value_dim)
    return o, lse


class ReferenceModule:
    """A stand-in for kgen.jit of a sparse spec: the spec fields kgen's SGLang DSA backend reads,
    and sparse_verify_attention computed by sparse_verify_ref (recording each call)."""

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

    def sparse_verify_attention(self, q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask, out=None, lse=None):
        self.calls.append(dict(topk_indices=topk_indices.clone(), tree_mask=tree_mask.clone()))
        o, row_lse = sparse_verify_ref(q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask,
                                       self.spec.model.softmax_scale)
        if out is None:
            out = torch.empty(o.shape, dtype=q.dtype, device=q.device)
        out.copy_(o)
        if lse is not None:
            lse.copy_(row_lse)
        return out, row_lse.float() if lse is None else lse
