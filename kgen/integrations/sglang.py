"""SGLang attention backend "kgen" (supported: sglang 0.5.23).

`register()` is the `sglang.srt.plugins` entry point (pyproject.toml): SGLang calls it in every
process before it parses arguments or builds a model runner, and it adds "kgen" to the attention
registry and to the `--attention-backend` / `--decode-attention-backend` /
`--prefill-attention-backend` choices. The backend is SGLang's Triton backend with two modes
taken over on absorbed-MLA layers (q [T, H, 576], one latent KV row per token, values = its
first 512 dims, bf16 or fp8 e4m3 cache):

- TARGET_VERIFY (tree verify) -> kgen `verify_attention`;
- DECODE without a draft (one query token per request) -> kgen `prefix_attention`.

An fp8 cache is read as SGLang's Triton backend reads it: a stored row means its e4m3 values
times the layer's k_scale (1 when the layer has none), and the layer's new rows are stored as
k / k_scale. Everything else (prefill, draft modes, non-MLA layers, a v_scale other than k_scale,
DCP, sliding windows, ...) is SGLang's Triton backend unchanged. SGLang's metadata is turned into kgen's on the device, with no
host sync: qo_indptr = arange(0, (B+1)·N, N); kv_indptr = cumsum(seq_lens) (page size 1: pages
are slots); kv_indices = the request's req_to_token slots, gathered by the same translator call
the Triton backend makes but into an int32 buffer; tree_mask = `mask_from_sglang` of the
custom_mask (or a chain when SGLang passes none, as Triton then runs causal). With CUDA graphs
(sglang 0.5.23's `init_cuda_graph_state` + `init_forward_metadata_out_graph` hooks) the same
metadata is written into address-stable buffers before capture and before every replay.

Tier-0 KV defragmentation (defrag_planner.py) runs every KGEN_DEFRAG_INTERVAL decode steps
where it is safe (see _defrag_blocker); KGEN_DEFRAG=0 turns it off; `defrag_stats()` reports it.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from .. import fp8
from ..mask import mask_from_parents, mask_from_sglang
from .defrag_planner import Defragmenter, DefragStats, Settings

NAME = "kgen"
SUPPORTED_SGLANG = ("0.5.23",)
KV_DTYPES = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn"}  # SGLang's cache dtype -> kgen's
logger = logging.getLogger(__name__)


# ---- registration ---------------------------------------------------------------------------


def register() -> None:
    """Add the "kgen" backend to SGLang's registry and CLI choices (idempotent)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    version = _sglang_version()
    if version not in SUPPORTED_SGLANG:
        logger.warning("kgen supports sglang %s; this is sglang %s", " / ".join(SUPPORTED_SGLANG), version)
    if NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([NAME])
    if NAME not in ATTENTION_BACKENDS:
        register_attention_backend(NAME)(create_backend)


def create_backend(model_runner):
    """The registry's factory: runner -> KgenAttnBackend."""
    return backend_class()(model_runner)


def _sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "unknown"


@functools.cache
def backend_class() -> type:
    """KgenAttnBackend: kgen's methods in front of SGLang's TritonAttnBackend."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return type("KgenAttnBackend", (_KgenMethods, TritonAttnBackend), {"__module__": __name__})


_BACKENDS: "weakref.WeakSet" = weakref.WeakSet()


def defrag_stats() -> list[dict]:
    """The fragmentation report of every kgen backend in this process."""
    return [b.defrag_stats() for b in list(_BACKENDS)]


# ---- kgen's half: SGLang metadata -> kgen inputs, and the calls ---------------------------------


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
    """Builds kgen's inputs from what SGLang's Triton backend is given, and runs kgen's ops.

    Needs no sglang import, so it is tested on its own (tests/test_sglang_gpu.py)."""

    def __init__(self, module, max_context_len: int):
        self.module = module
        m, tree = module.spec.model, module.spec.tree
        self.heads, self.dim, self.vdim = m.num_q_heads, m.head_dim, m.value_dim
        self.scale, self.max_nodes, self.words = m.softmax_scale, tree.nodes, tree.mask_words
        self.kv_fp8 = module.spec.cache.kv_dtype == "float8_e4m3fn"
        self.max_context_len = max_context_len
        self.device = module.device
        self.graph: dict[str, torch.Tensor] | None = None
        self._chains: dict[int, torch.Tensor] = {}

    def init_graph(self, max_bs: int) -> None:
        """Address-stable buffers for CUDA-graph capture and replay (up to max_bs requests)."""
        z = functools.partial(torch.zeros, dtype=torch.int32, device=self.device)
        self.graph = dict(qo_indptr=z(max_bs + 1), kv_indptr=z(max_bs + 1), kv_lens=z(max_bs),
                          kv_indices=z(max_bs * self.max_context_len), tree_mask=z(max_bs * self.max_nodes, self.words))

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
        scale for the one latent row, and a bf16 cache is read unscaled."""
        k_scale, v_scale = layer.k_scale, getattr(layer, "v_scale", None)
        if k_scale is None and v_scale is None:
            return 1.0
        if not self.kv_fp8 or k_scale is None or v_scale is None:
            return None
        k, v = float(layer.k_scale_float), float(layer.v_scale_float)
        try:
            return fp8.check_scale(k) if k == v else None
        except ValueError:  # not a scale kgen's ops accept (inf, nan, <= 0): Triton's
            return None

    def verify(self, q: torch.Tensor, k: torch.Tensor, kv_cache: torch.Tensor, meta: Meta, out: torch.Tensor,
               kv_scale: float = 1.0):
        """q [T, H*D] or [T, H, D]; k [T, 1, D] the tree tokens' latent rows (bf16, unscaled: kgen
        quantizes them for an fp8 spec); out [T, H*Dv]."""
        self.module.verify_attention(q.reshape(-1, self.heads, self.dim), kv_cache, k.reshape(-1, self.dim),
                                     meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_lens, meta.tree_mask,
                                     kv_scale=kv_scale, out=out.view(-1, self.heads, self.vdim))
        return out

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: Meta, out: torch.Tensor, kv_scale: float = 1.0):
        self.module.prefix_attention(q.reshape(-1, self.heads, self.dim), kv_cache, meta.qo_indptr, meta.kv_indptr,
                                     meta.kv_indices, meta.kv_lens, kv_scale=kv_scale,
                                     out=out.view(-1, self.heads, self.vdim))
        return out


def _kgen_for_model(backend, runner) -> tuple[KgenMLA | None, str]:
    """kgen's half for this model runner, or None and why kgen stays out of the way."""
    import kgen
    from kgen.arch import arch_for_capability
    from kgen.spec import parse_spec

    if not backend.use_mla:
        return None, "not an MLA model"
    if backend.dcp_size > 1 or backend.enable_deterministic or (backend.sliding_window_size or 0) > 0:
        return None, "DCP, deterministic inference or sliding windows are on"
    kv_dtype = KV_DTYPES.get(runner.kv_cache_dtype)
    if kv_dtype is None:
        return None, f"KV cache dtype {runner.kv_cache_dtype} (kgen reads {' or '.join(KV_DTYPES.values())})"
    cfg = runner.model_config
    dim = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    layers = {(m.tp_q_head_num, float(m.scaling)) for m in runner.model.modules()
              if getattr(m, "qk_head_dim", None) == dim and getattr(m, "v_head_dim", None) == cfg.kv_lora_rank
              and hasattr(m, "scaling") and hasattr(m, "tp_q_head_num")}
    if len(layers) != 1:
        return None, f"found {len(layers)} kinds of absorbed-MLA attention layer, kgen serves exactly one"
    (heads, scale), = layers
    path = os.environ.get("KGEN_SGLANG_SPEC")
    if path:
        spec = kgen.load_spec(path)
        if spec.cache.kv_dtype != kv_dtype:
            return None, f"KGEN_SGLANG_SPEC {path} reads a {spec.cache.kv_dtype} cache; this one is {kv_dtype}"
    else:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        spec = parse_spec(dict(
            name="sglang_runtime",
            model=dict(num_q_heads=heads, kv_lora_rank=cfg.kv_lora_rank, qk_rope_head_dim=cfg.qk_rope_head_dim,
                       softmax_scale=scale),
            cache=dict(page_size=1, kv_dtype=kv_dtype),
            tree=dict(max_nodes=max(1, backend.num_draft_tokens or 1, backend.target_verify_num_tokens_per_req or 1)),
            target=dict(arch=arch_for_capability(props.major, props.minor).name)), "the SGLang model config")
    return KgenMLA(kgen.jit(spec), backend.max_context_len), ""


# ---- the backend ---------------------------------------------------------------------------------


class _KgenMethods:
    """KgenAttnBackend's own methods; backend_class() puts them in front of TritonAttnBackend."""

    def __init__(self, model_runner, *args, **kwargs):
        super().__init__(model_runner, *args, **kwargs)
        try:
            self.kgen, self.kgen_off_reason = _kgen_for_model(self, model_runner)
        except Exception as e:  # an arch kgen has no plan for, a compile error, ...: serve with Triton
            self.kgen, self.kgen_off_reason = None, f"{type(e).__name__}: {e}"
        if self.kgen is None:
            logger.warning("kgen backend: every mode runs on SGLang's Triton backend (%s)", self.kgen_off_reason)
        self._kgen_meta: Meta | None = None
        self._defrag = _DefragHook(self, model_runner)
        _BACKENDS.add(self)

    def defrag_stats(self) -> dict:
        return self._defrag.defragmenter.stats.as_dict()

    # -- metadata: eager, and the CUDA-graph hooks of sglang 0.5.23 --
    def init_forward_metadata(self, forward_batch):
        self._defrag.maybe_run(forward_batch)
        super().init_forward_metadata(forward_batch)
        self._kgen_meta = self._kgen_plan(forward_batch, graph=False)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self.kgen is not None:
            self.kgen.init_graph(max_bs)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if not in_capture:
            self._defrag.maybe_run(forward_batch)
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        self._kgen_meta = self._kgen_plan(forward_batch, graph=True)

    def _kgen_plan(self, fb, *, graph: bool) -> Meta | None:
        mode = fb.forward_mode
        verify = mode.is_target_verify()
        if self.kgen is None or not (verify or (mode.is_decode() and fb.spec_info is None)):
            return None
        bs = len(fb.req_pool_indices) if verify else fb.batch_size
        seq_lens, rows = fb.seq_lens[:bs], fb.req_pool_indices[:bs]

        def fill(kv_indptr, out):  # the Triton backend's gather (_fill_kv_indptr_and_indices), into int32
            self.kv_index_translator.pack_read_stream(fb.kv_loc_plan, req_pool_indices=rows, seq_lens=seq_lens,
                                                      indptr=kv_indptr, out=out)

        n = self._target_verify_num_tokens_per_req(fb.spec_info) if verify else 1
        capacity = None if graph or fb.seq_lens_sum is None else max(1, int(fb.seq_lens_sum))
        mask = None
        if verify and not graph:
            mask = self.forward_metadata.custom_mask  # spec_info.custom_mask
        elif verify and self._verify_mask is not None and getattr(fb.spec_info, "custom_mask", None) is not None:
            mask = self._verify_mask.buffer  # what Triton's captured kernels read; its out_graph just filled it
        return self.kgen.plan(seq_lens, fill, tokens_per_req=n, verify=verify, graph=graph, capacity=capacity,
                              custom_mask=mask)

    # -- forward --
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        kv_scale = self._kgen_kv_scale(layer, q, k, v, sinks, score_mod, aux_tensors)
        if not forward_batch.forward_mode.is_target_verify() or kv_scale is None:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks=sinks,
                                          score_mod=score_mod, aux_tensors=aux_tensors)
        self._save_kv(layer, forward_batch, k, v, save_kv_cache)
        o = getattr(forward_batch, "_attn_output", None)  # a caller's output buffer, as Triton honours it
        if o is None:
            o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        return self.kgen.verify(q, k, self.token_to_kv_pool.get_key_buffer(layer.layer_id), self._kgen_meta, o,
                                kv_scale)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        kv_scale = self._kgen_kv_scale(layer, q, k, v, sinks, score_mod, aux_tensors)
        if not forward_batch.forward_mode.is_decode() or kv_scale is None:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, sinks=sinks,
                                          score_mod=score_mod, aux_tensors=aux_tensors)
        self._save_kv(layer, forward_batch, k, v, save_kv_cache)
        o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        return self.kgen.decode(q, self.token_to_kv_pool.get_key_buffer(layer.layer_id), self._kgen_meta, o,
                                kv_scale)

    def _kgen_kv_scale(self, layer, q, k, v, sinks, score_mod, aux_tensors) -> float | None:
        """The kv_scale kgen serves this layer's call with, or None: the call is Triton's."""
        g = self.kgen
        serves = (self._kgen_meta is not None and k is not None and v is not None and sinks is None
                  and score_mod is None and aux_tensors is None and q.dtype == torch.bfloat16
                  and layer.qk_head_dim == g.dim and layer.v_head_dim == g.vdim and layer.tp_q_head_num == g.heads
                  and layer.tp_k_head_num == 1 and float(layer.scaling) == g.scale
                  and not layer.logit_cap and (layer.sliding_window_size is None or layer.sliding_window_size < 0)
                  and getattr(layer, "xai_temperature_len", -1) <= 0)
        return g.kv_scale(layer) if serves else None

    def _save_kv(self, layer, fb, k, v, save_kv_cache: bool) -> None:
        if save_kv_cache:  # as the Triton backend stores an MLA layer's row: k / k_scale when scaled (no SWA)
            from sglang.srt.mem_cache.memory_pool import KVWriteLoc

            if layer.k_scale is not None:
                k = k.clone().div_(layer.k_scale)  # a copy: the tree keys are read unscaled below
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(fb), k, v)


# ---- tier-0 defrag on SGLang's pools ---------------------------------------------------------------


class _FreeList:
    """SlotAllocator over SGLang's page-size-1 TokenToKVPoolAllocator (free_pages, release_pages)."""

    def __init__(self, allocator):
        self.a = allocator

    def free_slots(self) -> torch.Tensor:
        return torch.cat([self.a.free_pages, self.a.release_pages]).cpu()

    def take(self, slots: torch.Tensor) -> None:
        slots = slots.to(self.a.free_pages.device)
        self.a.free_pages = self.a.free_pages[~torch.isin(self.a.free_pages, slots)]
        self.a.release_pages = self.a.release_pages[~torch.isin(self.a.release_pages, slots)]

    def release(self, slots: torch.Tensor) -> None:
        self.a.free(slots.to(self.a.free_pages.device))


class _ReqRows:
    """SlotTable over req_to_token rows [0, length) of the batch's requests."""

    def __init__(self, req_to_token: torch.Tensor, rows: list[int], lengths: list[int]):
        self.t = req_to_token
        self.lengths: dict[int, int] = {}
        for r, n in zip(rows, lengths):  # a CUDA-graph batch may pad with repeated rows of length 1
            self.lengths[r] = max(n, self.lengths.get(r, 0))

    def rows(self):
        return [(r, self.t[r, :n].cpu()) for r, n in self.lengths.items()]

    def rewrite(self, row, slots: torch.Tensor) -> None:
        self.t[row, :slots.numel()] = slots.to(self.t.device, self.t.dtype)


def _defrag_blocker(backend, runner) -> str:
    """Why tier-0 defrag must not run on this server ("" when it may)."""
    if os.environ.get("KGEN_DEFRAG", "1") == "0":
        return "turned off (KGEN_DEFRAG=0)"
    if backend.kgen is None:
        return f"kgen does not serve this model ({backend.kgen_off_reason})"
    try:
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.runtime_context import get_memory, get_spec

        radix = not get_memory().disable_radix_cache
        unified = bool(getattr(get_memory(), "enable_unified_memory", False))
        spec = get_spec().speculative_algorithm
    except Exception as e:  # an SGLang whose config this code cannot read: stay safe
        return f"cannot read SGLang's settings ({e})"
    if type(runner.token_to_kv_pool_allocator) is not TokenToKVPoolAllocator or backend.page_size != 1:
        return "needs --page-size 1 and SGLang's plain token allocator"
    if radix or unified:
        return "the radix cache (or unified memory) also points at request slots: use --disable-radix-cache"
    if spec not in (None, "", "NONE") and str(spec).upper() != "NONE":
        return "a speculative draft model keeps its own KV in the same slots, which tier-0 does not move yet"
    if not isinstance(getattr(backend.token_to_kv_pool, "kv_buffer", None), list):
        return "the KV pool has no per-layer kv_buffer list"
    return ""


class _DefragHook:
    """Every KGEN_DEFRAG_INTERVAL decode steps, before the step's metadata is built (so the step
    reads the moved rows), move fragmented requests' KV into contiguous runs (one kgen defrag
    launch for all layers). The pass syncs with the host: it is a scheduler-side operation."""

    def __init__(self, backend, runner):
        self.backend = backend
        self.defragmenter = Defragmenter(Settings(
            threshold=float(os.environ.get("KGEN_DEFRAG_THRESHOLD", 0.25)),
            min_tokens=max(2, int(os.environ.get("KGEN_DEFRAG_MIN_TOKENS", 256))),
            max_tokens=int(os.environ.get("KGEN_DEFRAG_MAX_TOKENS", 1 << 20))))
        self.interval = max(1, int(os.environ.get("KGEN_DEFRAG_INTERVAL", 256)))
        self.steps = 0
        self.defragmenter.stats = DefragStats(disabled=_defrag_blocker(backend, runner))

    def maybe_run(self, fb) -> None:
        if self.defragmenter.stats.disabled or not fb.forward_mode.is_decode():
            return
        self.steps += 1
        if self.steps % self.interval:
            return
        b = self.backend
        # The step writes the current token's KV during the forward, at a slot already chosen:
        # that last token stays where it is.
        lengths = (fb.seq_lens[:fb.batch_size] - 1).tolist()
        table = _ReqRows(b.req_to_token, fb.req_pool_indices[:fb.batch_size].tolist(), lengths)
        layers = b.token_to_kv_pool.kv_buffer
        self.defragmenter.run(_FreeList(b.token_to_kv_pool_allocator), table,
                              lambda src, dst: b.kgen.module.defrag(layers, src, dst))
