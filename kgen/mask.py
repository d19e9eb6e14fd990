"""Tree visibility masks: node i sees itself and its ancestors (DESIGN §5 layout: bit j of row i,
word j // 32, bit j % 32, in int32 words).

Helpers build the bit-packed mask from parent indices (batched, on the device), from a dense
bool mask, and from SGLang's custom_mask layout.
"""

from __future__ import annotations

import torch


def _pack_bits(dense: torch.Tensor, words: int) -> torch.Tensor:
    """[rows, n] bool -> [rows, words] int32 with bit j of word j // 32."""
    rows, n = dense.shape
    if n > words * 32:
        raise ValueError(f"mask has {n} columns but {words} words hold only {words * 32}")
    padded = torch.zeros(rows, words * 32, dtype=torch.int64, device=dense.device)
    padded[:, :n] = dense.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=dense.device) << torch.arange(32, device=dense.device)
    packed = (padded.view(rows, words, 32) * weights).sum(-1)  # < 2**32
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_bits(mask: torch.Tensor, n: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, n] bool."""
    bits = (mask.to(torch.int64).unsqueeze(-1) >> torch.arange(32, device=mask.device)) & 1
    return bits.reshape(mask.shape[0], -1)[:, :n].bool()


def visibility_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] parent indices (-1 for the root, or for padding nodes past a request's size)
    -> [B, N, N] bool, row i true at i and its ancestors. Runs on the parents' device with
    log2(N) pointer-doubling steps (no host sync)."""
    if parents.dim() != 2:
        raise ValueError(f"parents must be [batch, nodes], got shape {tuple(parents.shape)}")
    b, n = parents.shape
    idx = torch.arange(n, device=parents.device)
    vis = torch.zeros(b, n, n, dtype=torch.bool, device=parents.device)
    vis[:, idx, idx] = True
    anc = parents.long().clone()  # anc = 2^k-th ancestor, -1 past the root
    for _ in range(max(1, (n - 1).bit_length())):
        has = anc >= 0
        safe = anc.clamp(min=0)
        # node i also sees everything its current ancestor sees
        gathered = torch.gather(vis, 1, safe.unsqueeze(-1).expand(b, n, n))
        vis = vis | (gathered & has.unsqueeze(-1))
        anc = torch.where(has, torch.gather(anc, 1, safe), anc)
        anc = torch.where(anc >= 0, anc, torch.full_like(anc, -1))
    return vis


def mask_from_parents(parents: torch.Tensor, counts: torch.Tensor | None = None, words: int | None = None) -> torch.Tensor:
    """Batched parents [B, N] (node counts per request in `counts`, default N) -> the
    [sum counts, words] int32 tree_mask of DESIGN §5, requests concatenated."""
    b, n = parents.shape
    words = words or (n + 31) // 32
    vis = visibility_from_parents(parents)
    packed = _pack_bits(vis.reshape(b * n, n), words).view(b, n, words)
    if counts is None:
        return packed.reshape(b * n, words)
    keep = torch.arange(n, device=parents.device).unsqueeze(0) < counts.to(parents.device).unsqueeze(1)
    return packed[keep]


def mask_from_dense(dense: torch.Tensor, words: int) -> torch.Tensor:
    """[sum T, max T] bool (row i: which tokens of its own request it sees) -> [sum T, words] int32."""
    if dense.dtype != torch.bool or dense.dim() != 2:
        raise ValueError(f"dense mask must be a 2-D bool tensor, got {dense.dtype} {tuple(dense.shape)}")
    return _pack_bits(dense, words)


def mask_from_sglang(custom_mask: torch.Tensor, seq_lens: torch.Tensor, draft_tokens: int, words: int) -> torch.Tensor:
    """SGLang's verify custom_mask (flat bool, per request [N, prefix + N] row-major, concatenated
    in request order) -> [B * N, words] int32 tree mask. Every request has N = draft_tokens tree
    tokens; seq_lens holds each request's prefix length. Runs on the device, no host sync.
    Requests past the end of custom_mask (the padded lanes of a CUDA-graph batch, whose output
    is discarded) read its last element instead of out-of-bounds memory."""
    n = draft_tokens
    bsz = seq_lens.shape[0]
    dev = custom_mask.device
    seq = seq_lens.to(device=dev, dtype=torch.int64)
    starts = torch.cumsum(n * (seq + n), 0) - n * (seq + n)  # each request's mask offset
    rows = torch.arange(n, device=dev)
    cols = torch.arange(n, device=dev)
    # element (b, i, j) of the tree part sits at starts[b] + i * (seq[b] + n) + seq[b] + j
    flat = (starts.view(bsz, 1, 1) + rows.view(1, n, 1) * (seq + n).view(bsz, 1, 1)
            + seq.view(bsz, 1, 1) + cols.view(1, 1, n))
    dense = custom_mask.view(-1)[flat.view(-1).clamp_(max=custom_mask.numel() - 1)].view(bsz * n, n).bool()
    return _pack_bits(dense, words)


def static_mask_words(parents: tuple[int, ...]) -> list[int]:
    """A static tree's mask as a flat list of unsigned 32-bit words, for compiling it in."""
    vis = visibility_from_parents(torch.tensor([list(parents)], dtype=torch.int64))[0]
    packed = _pack_bits(vis, (len(parents) + 31) // 32)
    return [int(w) & 0xFFFFFFFF for w in packed.view(-1).tolist()]
