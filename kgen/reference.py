"""Plain PyTorch reference for the ops of DESIGN §5, written from the semantics, not the kernels.

Everything is computed in float64 on the inputs' device: a loop over requests, vectorized over
tokens and heads. Attention ops return (o [sum T, H, Dv], lse [sum T, H]) in float64; a row that
sees no key gets o = 0 and lse = -inf.
"""

from __future__ import annotations

import torch

MAX_LOGITS = 1 << 26  # float64 logits materialized at once (512 MB); larger requests go in row chunks


def attend(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, scale: float, value_dim: int):
    """q [T, H, D], keys [K, D], visible [T, K] bool -> (o [T, H, value_dim], lse [T, H]) float64.
    logits = scale * <q, key> over all D dims; values are the first value_dim dims of the keys."""
    q, keys = q.double(), keys.double()
    t, h, _ = q.shape
    o = q.new_zeros(t, h, value_dim)
    lse = q.new_full((t, h), float("-inf"))
    if t == 0 or keys.shape[0] == 0:
        return o, lse
    values = keys[:, :value_dim]
    rows = max(1, MAX_LOGITS // (h * keys.shape[0]))
    for s in range(0, t, rows):
        logits = scale * torch.einsum("thd,kd->thk", q[s:s + rows], keys)
        logits = logits.masked_fill(~visible[s:s + rows, None, :], float("-inf"))
        row_lse = torch.logsumexp(logits, dim=-1)
        seen = torch.isfinite(row_lse).unsqueeze(-1)
        p = torch.where(seen, torch.exp(logits - row_lse.unsqueeze(-1)), 0.0)
        o[s:s + rows] = p @ values
        lse[s:s + rows] = row_lse
    return o, lse


def prefix_rows(kv_cache: torch.Tensor, pages: torch.Tensor, length: int, page_size: int) -> torch.Tensor:
    """A prefix's rows [length, D]: token t sits at slot pages[t // P] * P + t % P, where pages
    are the request's kv_indices[kv_indptr[b]:kv_indptr[b + 1]]."""
    cache = kv_cache.reshape(kv_cache.shape[0], -1)  # [num_slots, D] or [num_slots, 1, D]
    t = torch.arange(length, device=cache.device)
    return cache[pages.to(cache.device).long()[t // page_size] * page_size + t % page_size]


def dequantize_scaled_rows(rows: torch.Tensor, latent: int) -> torch.Tensor:
    """SGLang DSA pool rows (uint8 [N, B], DESIGN §11) -> float64 [N, latent + rope]: latent dim d is
    e4m3 byte d times fp32 scale d // 128 (the scales follow the latent bytes), then the bf16 rope."""
    rows = rows.reshape(-1, rows.shape[-1])  # [N, B] or [N, 1, B]; N may be 0
    n, blocks = rows.shape[0], latent // 128
    scales = rows[:, latent:latent + 4 * blocks].contiguous().view(torch.float32).double()
    lat = rows[:, :latent].contiguous().view(torch.float8_e4m3fn).double().reshape(n, blocks, 128)
    rope = rows[:, latent + 4 * blocks:].contiguous().view(torch.bfloat16).double()
    return torch.cat([(lat * scales.unsqueeze(-1)).reshape(n, latent), rope], dim=1)


def tree_visibility(tree_mask: torch.Tensor, n: int) -> torch.Tensor:
    """One request's rows of tree_mask [n, words] int32 -> [n, n] bool: bit j of row i
    (word j // 32, bit j % 32) says tree token i sees tree token j."""
    j = torch.arange(n, device=tree_mask.device)
    return ((tree_mask.long()[:, j // 32] >> (j % 32)) & 1).bool()


def _keys(rows: torch.Tensor, value_dim: int, kv_scale: float) -> torch.Tensor:
    """Key rows as float64: uint8 rows are the DSA pool's scaled format, others mean value * kv_scale."""
    return dequantize_scaled_rows(rows, value_dim) if rows.dtype == torch.uint8 else rows.double() * kv_scale


def _attention(q, qo_indptr, scale, value_dim, prefix=None, tree=None):
    """Per-request attention over the prefix keys (all visible) and/or the masked tree keys."""
    sum_t, h, _ = q.shape
    o = torch.zeros(sum_t, h, value_dim, dtype=torch.float64, device=q.device)
    lse = torch.full((sum_t, h), float("-inf"), dtype=torch.float64, device=q.device)
    qo = qo_indptr.tolist()
    if prefix is not None:
        kv_cache, kv_indptr, kv_indices, kv_lens, page_size, kv_scale = prefix
        kv_indptr, kv_lens = kv_indptr.tolist(), kv_lens.tolist()
    if tree is not None:
        k_tree, tree_mask = (t.to(q.device) for t in tree)
    for b in range(len(qo) - 1):
        s, e = qo[b], qo[b + 1]
        keys, visible = [], []
        if prefix is not None:
            pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
            keys.append(_keys(prefix_rows(kv_cache, pages, kv_lens[b], page_size).to(q.device), value_dim, kv_scale))
            visible.append(torch.ones(e - s, kv_lens[b], dtype=torch.bool, device=q.device))
        if tree is not None:
            keys.append(_keys(k_tree[s:e], value_dim, 1.0))
            visible.append(tree_visibility(tree_mask[s:e], e - s))
        o[s:e], lse[s:e] = attend(q[s:e], torch.cat(keys), torch.cat(visible, dim=1), scale, value_dim)
    return o, lse


def prefix_attention_ref(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, page_size, scale, value_dim=512,
                         kv_scale=1.0):
    """Tree tokens against their paged prefixes only. A cache row means its values * kv_scale
    (an fp8 cache's per-tensor scale; 1 for bf16), or, for a uint8 cache, its dequantized DSA
    pool row (dequantize_scaled_rows)."""
    return _attention(q, qo_indptr, scale, value_dim,
                      prefix=(kv_cache, kv_indptr, kv_indices, kv_lens, page_size, kv_scale))


def tree_attention_ref(q, k_tree, qo_indptr, tree_mask, scale, value_dim=512):
    """Tree tokens against the tree tokens of their request that the mask shows them."""
    return _attention(q, qo_indptr, scale, value_dim, tree=(k_tree, tree_mask))


def verify_attention_ref(q, kv_cache, k_tree, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, page_size,
                         scale, value_dim=512, kv_scale=1.0):
    """Tree tokens against the whole prefix plus their visible tree tokens, in one softmax."""
    return _attention(q, qo_indptr, scale, value_dim,
                      prefix=(kv_cache, kv_indptr, kv_indices, kv_lens, page_size, kv_scale), tree=(k_tree, tree_mask))


def sparse_verify_attention_ref(q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask, scale, value_dim=512,
                                kv_scale=1.0):
    """DESIGN §12: token i attends the cache slots row i of topk_indices lists (entries >= 0; -1 is
    no key) plus the tree tokens of its request its mask row shows, in one softmax. A cache row
    means its values * kv_scale, or, for a uint8 cache, its dequantized DSA pool row (as for the
    dense ops; tree rows likewise, used as given otherwise)."""
    sum_t, h, _ = q.shape
    o = torch.zeros(sum_t, h, value_dim, dtype=torch.float64, device=q.device)
    lse = torch.full((sum_t, h), float("-inf"), dtype=torch.float64, device=q.device)
    cache = kv_cache.reshape(kv_cache.shape[0], -1)
    lists, k_tree, tree_mask = (t.to(q.device) for t in (topk_indices, k_tree, tree_mask))
    qo = qo_indptr.tolist()
    for b in range(len(qo) - 1):
        s, e = qo[b], qo[b + 1]
        rows = lists[s:e].long()
        listed = rows >= 0
        slots = torch.unique(rows[listed])  # sorted: the request's union of lists
        seen = torch.zeros(e - s, slots.numel(), dtype=torch.bool, device=q.device)
        token = torch.arange(e - s, device=q.device).unsqueeze(1).expand_as(rows)
        seen[token[listed], torch.searchsorted(slots, rows[listed])] = True
        keys = torch.cat([_keys(cache[slots.to(cache.device)].to(q.device), value_dim, kv_scale),
                          _keys(k_tree[s:e], value_dim, 1.0)])
        visible = torch.cat([seen, tree_visibility(tree_mask[s:e], e - s)], dim=1)
        o[s:e], lse[s:e] = attend(q[s:e], keys, visible, scale, value_dim)
    return o, lse


def merge_states_ref(o_a, lse_a, o_b, lse_b):
    """Combine two attention states of the same rows as if their key sets were united.
    A state with lse = -inf contributes nothing (its o is ignored, whatever it holds)."""
    o_a, lse_a, o_b, lse_b = (t.double() for t in (o_a, lse_a, o_b, lse_b))
    lse = torch.logaddexp(lse_a, lse_b)

    def part(o, part_lse):
        live = (part_lse > float("-inf")).unsqueeze(-1)
        return torch.where(live, torch.exp(part_lse - lse).unsqueeze(-1) * o, 0.0)

    return part(o_a, lse_a) + part(o_b, lse_b), lse


def defrag_ref(caches, src, dst):
    """Copies of `caches` (stacked [layers, slots, ...] tensor or list of [slots, ...] tensors)
    where row dst[n] holds what row src[n] held before, all reads before any write."""
    src, dst = src.long(), dst.long()
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError("dst: slots must be distinct")
    if isinstance(caches, torch.Tensor):
        moved = caches.clone()
        moved[:, dst.to(caches.device)] = caches[:, src.to(caches.device)]
        return moved
    return [defrag_ref(c.unsqueeze(0), src, dst)[0] for c in caches]

