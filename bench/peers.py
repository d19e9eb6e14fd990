"""The public MLA kernels kgen is timed against, on the same inputs in the same run (DESIGN §9).

- FlashInfer MLA (`flashinfer.mla.BatchMLAPagedAttentionWrapper`, absorbed form, packed
  [.., 576] query and pages): backend `fa3` (sm_90 only, what a Hopper user runs) and `fa2`
  (the mma.sync-class kernel, every arch);
- FlashMLA's SM90 dense decode (`flash_mla_with_kvcache(..., causal=True, use_legacy=True)`,
  sgl-flash-mla 1.0.0; page size 64, q [B, T, H, 576], one T for every request).

Neither does trees: each runs `causal=True`, i.e. a chain, the closest it can do, on the same
pool, query and tree-token rows as kgen's input set (kgen runs random trees: strictly more work).
chain_kv() writes a request's T tree tokens into the pages after its prefix (pages no prefix
uses, so kgen's own inputs are untouched) and zeroes the rest of the last page, since these
kernels read whole pages. Decode rows (T = 1) attend to the prefix alone, as kgen's do.

A peer that cannot run here (package missing, wrong arch, page size, an fp8 cache) is skipped
with the reason unavailable() gives; it never fails the benchmark.

sparse_decode() is FlashMLA's sparse decode (`indices=`, SGLang's DSA path on Hopper) for the
sparse benchmark: 656-byte fp8 rows, page 64, heads zero-padded to 64.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

import torch

FLASHINFER = ("flashinfer_fa3", "flashinfer_fa2")
PEERS = (*FLASHINFER, "flashmla")
LABELS = {"flashinfer_fa3": "FlashInfer fa3", "flashinfer_fa2": "FlashInfer fa2", "flashmla": "FlashMLA"}
FLASHMLA_PAGE = 64
WORKSPACE_BYTES = 256 << 20  # FlashInfer's split-KV partial outputs, shared by a shape's calls (run in order)


class PeerError(RuntimeError):
    """A peer cannot run these inputs; its column is skipped with this reason."""


def default_peers(plan_arch: str) -> tuple[str, ...]:
    """The peers of a plan: a Hopper plan against what a Hopper user runs (fa3, FlashMLA), any
    other plan against FlashInfer's mma.sync-class fa2."""
    return ("flashinfer_fa3", "flashmla") if plan_arch == "sm_90" else ("flashinfer_fa2",)


def flashinfer_for(plan_arch: str) -> str:
    """The FlashInfer backend the "x FlashInfer" column compares a plan with."""
    return "flashinfer_fa3" if plan_arch == "sm_90" else "flashinfer_fa2"


def parse_peers(text: str, plan_arch: str) -> tuple[str, ...]:
    """--peers: "auto" (default_peers), "none", "all" or a comma-separated list of PEERS."""
    if text == "auto":
        return default_peers(plan_arch)
    if text == "none":
        return ()
    if text == "all":
        return PEERS
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise ValueError(f"--peers: unknown peer {', '.join(bad)}; choose from auto, none, all, {', '.join(PEERS)}")
    return names


def _import(name: str):
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", tempfile.gettempdir())  # its JIT cache: under /tmp
    if name in FLASHINFER:
        import flashinfer
        from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

        return flashinfer.__version__, (BatchMLAPagedAttentionWrapper, MLAPlanMetadata)
    import flash_mla

    return flash_mla.__version__, flash_mla


def unavailable(name: str, spec, page_size: int, major: int) -> str | None:
    """Why `name` cannot run this spec at this page size on a GPU of compute capability `major`.x
    (None: it can)."""
    m = spec.model
    if spec.cache.kv_dtype != "bfloat16":
        return f"timed on bf16 KV only (this spec's cache is {spec.cache.kv_dtype})"
    if (m.head_dim, m.value_dim) != (576, 512):
        return f"MLA kernels for 576/512 dims only (spec: {m.head_dim}/{m.value_dim})"
    if name in ("flashinfer_fa3", "flashmla") and major != 9:
        return f"{LABELS[name]} runs on sm_90 only (this GPU is sm_{major}x)"
    if name == "flashmla" and page_size != FLASHMLA_PAGE:
        return f"FlashMLA's dense decode takes page size {FLASHMLA_PAGE} only (this run: {page_size})"
    try:
        _import(name)
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip, not to stop
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:200]
    return None


def version(name: str) -> str:
    return _import(name)[0]


# ---- the chain a peer attends to --------------------------------------------------------------


@dataclass
class ChainKV:
    """An input set as a peer reads it: request b's keys are its prefix and then (verify rows)
    its tree tokens, in pages of the input set's own pool, attended causally."""

    pages: torch.Tensor  # the pool viewed [num_pages, P, 576]
    kv_indptr: torch.Tensor  # [B + 1] int32, in pages
    kv_indices: torch.Tensor  # int32 pages
    kv_lens: torch.Tensor  # [B] int32: L (+ T)
    page_size: int


def extra_pages(tree_sizes: list[int], page_size: int) -> int:
    """Pool pages chain_kv() may need beyond the prefixes' (a bound: the tree tokens may start a
    new page and straddle one more)."""
    return sum(math.ceil(t / page_size) + 1 for t in tree_sizes)


def chain_kv(x, *, with_tree: bool = True) -> ChainKV:
    """The chain view of VerifyInputs `x` (see the module docstring); writes the tree tokens'
    rows into pool slots no prefix uses, and zeroes the unused rest of each request's last page."""
    from .baseline import token_slots

    p = x.page_size
    dev = x.kv_cache.device
    lens = x.kv_lens.tolist()
    qo, indptr = x.qo_indptr.tolist(), x.kv_indptr.tolist()
    trees = [qo[b + 1] - qo[b] for b in range(len(lens))]
    total = [n + (t if with_tree else 0) for n, t in zip(lens, trees)]
    pages = [math.ceil(n / p) for n in total]
    num_pages = x.kv_cache.shape[0] // p
    used = torch.zeros(num_pages, dtype=torch.bool, device=dev)
    used[x.kv_indices.long()] = True
    free = (~used).nonzero().flatten().to(torch.int32)
    need = [pages[b] - (indptr[b + 1] - indptr[b]) for b in range(len(lens))]
    if sum(need) > free.numel():
        raise PeerError(f"the pool has {free.numel()} free pages, the tree tokens need {sum(need)}")
    chunks, start = [], 0
    for b in range(len(lens)):
        chunks += [x.kv_indices[indptr[b]:indptr[b + 1]], free[start:start + need[b]]]
        start += need[b]
    kv_indices = torch.cat(chunks)
    kv_indptr = torch.tensor([0, *pages], device=dev).cumsum(0).to(torch.int32)
    # every slot of every page, with its request's token position
    span = torch.tensor([n * p for n in pages], device=dev)
    slots = token_slots(kv_indptr, kv_indices, span, p)
    req = torch.repeat_interleave(torch.arange(len(lens), device=dev), span)
    pos = torch.arange(slots.numel(), device=dev) - (span.cumsum(0) - span)[req]
    prefix, end = torch.tensor(lens, device=dev)[req], torch.tensor(total, device=dev)[req]
    if with_tree:
        x.kv_cache[slots[(pos >= prefix) & (pos < end)]] = x.k_tree
    x.kv_cache[slots[pos >= end]] = 0
    return ChainKV(x.kv_cache.view(num_pages, p, -1), kv_indptr, kv_indices,
                   torch.tensor(total, dtype=torch.int32, device=dev), p)


# ---- the calls ----------------------------------------------------------------------------------


def prepare(name: str, x, kv: ChainKV, workspace: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """A call of peer `name` on one input set (its planning done here, outside any timing); it
    returns o [sum T, H, 512]."""
    if name in FLASHINFER:
        return _flashinfer(name.split("_")[1], x, kv, workspace)
    return _flashmla(x, kv)


def workspace_for(device) -> torch.Tensor:
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def _flashinfer(backend: str, x, kv: ChainKV, workspace: torch.Tensor | None):
    wrapper_cls, metadata = _import("flashinfer_" + backend)[1]
    total, heads, dim = x.q.shape
    workspace = workspace_for(x.q.device) if workspace is None else workspace
    wrapper = wrapper_cls(workspace, backend=backend)
    wrapper.plan(metadata=metadata.csr(x.qo_indptr, kv.kv_indptr, kv.kv_indices, kv.kv_lens), num_heads=heads,
                 head_dim_ckv=x.value_dim, head_dim_kpe=dim - x.value_dim, page_size=kv.page_size, causal=True,
                 sm_scale=x.scale, q_data_type=x.q.dtype, kv_data_type=kv.pages.dtype)
    out = torch.empty(total, heads, x.value_dim, dtype=x.q.dtype, device=x.q.device)
    q, pages = x.q, kv.pages

    def call():
        return wrapper.run(query=q, kv_cache=pages, out=out)

    return call


def block_table(kv: ChainKV) -> torch.Tensor:
    """[B, most pages] int32: request b's pages in order, then zeros (never read: past its length)."""
    indptr = kv.kv_indptr.tolist()
    counts = [indptr[b + 1] - indptr[b] for b in range(len(indptr) - 1)]
    table = torch.zeros(len(counts), max(counts, default=0), dtype=torch.int32, device=kv.kv_indices.device)
    for b, n in enumerate(counts):
        table[b, :n] = kv.kv_indices[indptr[b]:indptr[b + 1]]
    return table


def _flashmla(x, kv: ChainKV):
    flash_mla = _import("flashmla")[1]
    total, heads, dim = x.q.shape
    qo = x.qo_indptr.tolist()
    trees = {qo[b + 1] - qo[b] for b in range(len(qo) - 1)}
    if len(trees) != 1:
        raise PeerError(f"FlashMLA takes q [B, T, H, D]: one tree size for every request (got {sorted(trees)})")
    if kv.page_size != FLASHMLA_PAGE:
        raise PeerError(f"FlashMLA's dense decode takes page size {FLASHMLA_PAGE} only (got {kv.page_size})")
    batch, t = len(qo) - 1, trees.pop()
    table = block_table(kv)
    q = x.q.view(batch, t, heads, dim)
    cache = kv.pages.view(kv.pages.shape[0], FLASHMLA_PAGE, 1, dim)
    meta = flash_mla.get_mla_metadata()[0]  # filled by the first call (outside the capture)
    lens, dv, scale = kv.kv_lens, x.value_dim, x.scale

    def call():
        o, _ = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, dv, meta, softmax_scale=scale, causal=True,
                                                use_legacy=True)
        return o.view(total, heads, dv)

    return call


# ---- FlashMLA's sparse decode (DSA; for bench/sparse.py) ---------------------------------------

DSA_ROW_BYTES = 656  # the DSA pool row (DESIGN §11, kgen.fp8.quantize_rows): 512 e4m3 | 4 fp32 scales | 64 bf16 rope
DSA_PAGE = 64
SPARSE_HEADS = (64, 128)  # FlashMLA's sparse kernels: SGLang pads fewer heads per rank up to these


def sparse_decode(q: torch.Tensor, kv_cache: torch.Tensor, topk_indices: torch.Tensor, *, scale: float,
                  value_dim: int = 512) -> Callable[[], torch.Tensor]:
    """FlashMLA's sparse decode as SGLang's DSA backend runs it on Hopper (`_forward_flashmla_kv`):
    every query token its own row (q [sum T, 1, H', 576]), its top-k list as `indices`, the pool's
    656-byte fp8 rows in pages of 64, heads zero-padded to H' = 64 (or 128). q [sum T, H, 576] bf16,
    kv_cache uint8 [slots, 656] (or [slots, 1, 656]), topk_indices int32 [sum T, K] of physical
    slots, -1 = no key; K a multiple of 64. Returns a call (the padded q and the split-KV schedule
    made here, outside any timing; the schedule is filled by the first call) giving o
    [sum T, H, value_dim]. The tree tokens are whatever the lists name: kgen's sparse verify adds
    the masked tree on top, so this peer does slightly less work."""
    flash_mla = _import("flashmla")[1]
    total, heads, dim = q.shape
    padded = next((h for h in SPARSE_HEADS if heads <= h), None)
    if padded is None:
        raise PeerError(f"FlashMLA's sparse decode takes at most {SPARSE_HEADS[-1]} heads (got {heads})")
    if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != DSA_ROW_BYTES:
        raise PeerError(f"FlashMLA's sparse decode reads {DSA_ROW_BYTES}-byte uint8 rows (got {kv_cache.dtype} "
                        f"{tuple(kv_cache.shape)})")
    slots = kv_cache.numel() // DSA_ROW_BYTES
    if slots % DSA_PAGE:
        raise PeerError(f"the pool's {slots} slots are not whole pages of {DSA_PAGE}")
    width = topk_indices.shape[-1]
    if width % 64:
        raise PeerError(f"FlashMLA's sparse decode takes top-k widths that are multiples of 64 (got {width})")
    q_in = q.new_zeros(total, 1, padded, dim)
    q_in[:, 0, :heads] = q
    cache = kv_cache.view(slots // DSA_PAGE, DSA_PAGE, 1, DSA_ROW_BYTES)
    indices = topk_indices.to(torch.int32).view(total, 1, width)
    lens = (topk_indices >= 0).sum(-1).to(torch.int32)  # ignored by the decode kernel; SGLang passes it
    table = torch.empty(total, 0, dtype=torch.int32, device=q.device)  # unused on the sparse path
    meta = flash_mla.get_mla_metadata()[0]

    def call():
        o, _ = flash_mla.flash_mla_with_kvcache(q_in, cache, table, lens, value_dim, meta, softmax_scale=scale,
                                                indices=indices, is_fp8_kvcache=True, use_legacy=True,
                                                kv_format="V32")
        return o[:, 0, :heads]

    return call


def sparse_reference(q: torch.Tensor, kv_cache: torch.Tensor, topk_indices: torch.Tensor, *, scale: float,
                     value_dim: int = 512) -> torch.Tensor:
    """float64 o [sum T, H, value_dim] of sparse_decode's semantics: token i attends to the
    dequantized rows its list names (-1 skipped); a list with no key gives o = 0."""
    from kgen.reference import attend, dequantize_scaled_rows

    keys = dequantize_scaled_rows(kv_cache, 512)
    o = torch.zeros(*q.shape[:2], value_dim, dtype=torch.float64, device=q.device)
    for i in range(q.shape[0]):
        listed = topk_indices[i][topk_indices[i] >= 0].long()
        if listed.numel():
            visible = torch.ones(1, listed.numel(), dtype=torch.bool, device=q.device)
            o[i:i + 1], _ = attend(q[i:i + 1], keys[listed], visible, scale, value_dim)
    return o


def sparse_check(device, *, heads: int = 8, tokens: int = 16, width: int = 2048, pages: int = 96,
                 seed: int = 0) -> dict:
    """sparse_decode against sparse_reference on random rows (unit normals in the pool's fp8 rows,
    kgen.fp8.quantize_rows) and lists (distinct slots per list, -1 tails of random length, one all
    -1 list): relative L2 of o and the largest per-row error."""
    from kgen.fp8 import quantize_rows

    g = torch.Generator(device).manual_seed(seed)
    pool = quantize_rows(torch.randn(pages * DSA_PAGE, 576, generator=g, device=device).to(torch.bfloat16), 512)
    q = torch.randn(tokens, heads, 576, generator=g, device=device).to(torch.bfloat16)
    lists = torch.stack([torch.randperm(pages * DSA_PAGE, generator=g, device=device)[:width]
                         for _ in range(tokens)]).to(torch.int32)
    keep = torch.randint(width // 2, width + 1, (tokens, 1), generator=g, device=device)
    lists[torch.arange(width, device=device) >= keep] = -1
    lists[-1] = -1
    scale = 576 ** -0.5
    o = sparse_decode(q, pool, lists, scale=scale)().double()
    ref = sparse_reference(q, pool, lists, scale=scale)
    diff, norm = torch.linalg.vector_norm(o - ref, dim=-1)[:-1], torch.linalg.vector_norm(ref, dim=-1)[:-1]
    return dict(heads=heads, tokens=tokens, width=width, rel_l2=(diff.norm() / norm.norm()).item(),
                worst_row=(diff / norm).max().item(), empty_row_max=o[-1].abs().max().item())
