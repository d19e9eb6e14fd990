"""SGLang attention backend "kgen" (SGLang 0.5.21, 0.5.22, 0.5.23; docs/sglang.md).

`plugin()` is the `sglang.srt.plugins` entry point (pyproject.toml): SGLang calls it in every
process before it parses arguments, and it registers "kgen" in SGLang's attention registry and
in the --attention-backend / --decode-attention-backend / --prefill-attention-backend choices.

The backend is SGLang's Triton backend with two forward modes taken over on absorbed-MLA layers
(q [T, H, 576], one latent KV row per token, values = its first 512 dims) over SGLang's plain MLA
KV pool (bf16 or fp8 e4m3 rows, page size 1) or its DSA pool (GLM-5, DeepSeek-V3.2: bf16 rows, or
fp8 rows with per-block scales, page size 64; read by slot, as Triton reads it; dense attention,
since SGLang's DSA indexer picks no top-k for a non-DSA backend); `kgen_mode` is the one place
that decides:

- TARGET_VERIFY (tree verify) -> kgen's verify attention (prefix split-KV + tree + merge);
- DECODE without a draft (one query token per request) -> kgen's prefix attention.

Everything else (prefill, draft modes, layers kgen cannot read as SGLang does, calls with extra
arguments) is SGLang's Triton backend unchanged. Server-arg resolution treats "kgen" as "triton"
for speculative decoding (a resolution hook): EAGLE trees (topk > 1) at page size > 1 take Triton's
draft path, with the draft's attention on Triton. Every SGLang internal used here goes through
sglang_compat.py. Per forward batch, `init_forward_metadata` (and the CUDA-graph hooks) turn
SGLang's metadata into kgen's on the device (no host sync) and prepare one kgen step; each layer
then only runs it. An fp8 cache is read as SGLang's Triton backend reads it: a stored row means
its e4m3 values times the layer's k_scale (1 without one); new rows are stored as k / k_scale.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging

import torch

from .. import env
from ..errors import KgenError
from ..kvrows import scaled_row_bytes
from ..spec import SCALE_BLOCK
from . import sglang_compat as compat
from . import sglang_defrag, sglang_dsa
from .sglang_batch import DECODE, VERIFY, BatchHooks, absorbed_mla_kind, kgen_mode
from .sglang_mla import KgenMLA

NAME = "kgen"
SCALED_ROWS_ON_TRITON = (
    "kgen backend: a {mode} call of layer {layer} on a DSATokenToKVPool of fp8 rows with per-block scales, which "
    "kgen does not serve and SGLang's Triton backend cannot read or write; serve GLM-5 with --kv-cache-dtype bf16, "
    "or keep every prefill free of a cached prefix (--disable-radix-cache --chunked-prefill-size -1) and the draft "
    "on bf16 rows (--speculative-draft-kv-cache-dtype bf16): docs/sglang.md")
KV_DTYPES = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn"}  # SGLang's cache dtype -> kgen's
logger = logging.getLogger(__name__)


# ---- registration ---------------------------------------------------------------------------


def plugin() -> None:
    """SGLang's plugin entry point: register(), or one error line saying why kgen is not there
    (SGLang would log a raised error with a traceback and carry on without kgen anyway)."""
    try:
        register()
    except KgenError as e:
        logger.error("kgen: %s", e)


def register() -> None:
    """Check the installed SGLang (sglang_compat.check), then add the "kgen" backend to its
    registry and CLI choices and its speculative-decoding resolution step (idempotent); with
    KGEN_DEFRAG=1 also install the defrag hook, with KGEN_DSA=1 kgen's DSA backend (sglang_dsa.py)."""
    compat.check()
    compat.register_backend(NAME, create_backend)
    compat.resolve_speculative_as_triton(NAME)
    if sglang_defrag.enabled():
        sglang_defrag.install()
    if sglang_dsa.enabled():
        sglang_dsa.install()


def create_backend(model_runner):
    """The registry's factory: model runner -> KgenAttnBackend."""
    return backend_class()(model_runner)


@functools.cache
def backend_class() -> type:
    """KgenAttnBackend: kgen's methods in front of SGLang's TritonAttnBackend."""
    return type("KgenAttnBackend", (_KgenMethods, compat.triton_backend_class()), {"__module__": __name__})


def _kgen_for_model(backend, runner) -> tuple[KgenMLA | None, str]:
    """kgen's half for this model runner and what it reads (the pool, its rows, its page size), or
    None and why kgen stays out of the way."""
    import kgen
    from kgen.arch import arch_for_capability
    from kgen.spec import parse_spec

    compat.check_instance(runner, "ModelRunner")
    compat.check_instance(runner.model_config, "ModelConfig")
    if not backend.use_mla:
        return None, "not an MLA model"
    if backend.dcp_size > 1 or backend.enable_deterministic or (backend.sliding_window_size or 0) > 0:
        return None, "DCP, deterministic inference or sliding windows are on"
    pool, rows = backend.token_to_kv_pool, backend.kgen_rows
    if rows is None or (rows.pool == "MLATokenToKVPool" and backend.page_size != 1):
        return None, (f"kgen reads SGLang's plain MLA KV pool with page size 1 or its DSATokenToKVPool, not a "
                      f"{type(pool).__name__} with page size {backend.page_size}")
    kv_dtype = KV_DTYPES.get(runner.kv_cache_dtype)
    if kv_dtype is None:
        return None, f"KV cache dtype {runner.kv_cache_dtype} (kgen reads {' or '.join(KV_DTYPES.values())})"
    cfg = runner.model_config
    dim = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    cache = dict(page_size=1, kv_dtype=kv_dtype)  # slots are rows, whatever the pool's page size
    if rows.scaled:
        width = scaled_row_bytes(cfg.kv_lora_rank, cfg.qk_rope_head_dim)
        if (rows.block, rows.rope_dtype, rows.width) != (SCALE_BLOCK, torch.bfloat16, width):
            return None, (f"scaled fp8 rows of {rows.width} B, {rows.block}-dim scale blocks and {rows.rope_dtype} "
                          f"rope (kgen reads {width} B rows: {SCALE_BLOCK}-dim blocks, bf16 rope)")
        cache["scales"] = "per_block"
    elif rows.width != dim:
        return None, f"{rows.width}-wide KV rows (kgen reads {dim}-wide latent rows)"
    layers = compat.attention_layers(runner.model)
    for layer in layers:
        compat.check_instance(layer, "RadixAttention")
    kind, why = absorbed_mla_kind(cfg, layers)
    if kind is None:
        return None, why
    heads, scale = kind
    path = env.path("KGEN_SGLANG_SPEC")
    if path:
        spec = kgen.load_spec(path)
        theirs = {k: getattr(spec.cache, k, "per_tensor") for k in cache}
        if theirs != cache:
            return None, f"KGEN_SGLANG_SPEC {path} has cache {theirs}; this pool needs {cache}"
    else:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        nodes = max(1, backend.num_draft_tokens or 1, compat.draft_tokens_per_request(backend, None) or 1)
        data = dict(model=dict(num_q_heads=heads, kv_lora_rank=cfg.kv_lora_rank,
                               qk_rope_head_dim=cfg.qk_rope_head_dim, softmax_scale=scale),
                    cache=cache, tree=dict(max_nodes=nodes),
                    target=dict(arch=arch_for_capability(props.major, props.minor).name))
        spec = parse_spec(dict(name=runtime_spec_name(data), **data), "the SGLang model config")
    return KgenMLA(kgen.jit(spec), backend.max_context_len), _serves(rows, kv_dtype, backend.page_size, dim)


def runtime_spec_name(data: dict) -> str:
    """A name for the spec derived from a model, as unique as its fields (kgen registers its ops per
    spec name, and one process may serve models of several shapes): sglang_h<heads>_n<nodes>_<kv>_<hash>."""
    cache = data["cache"]
    kv = {"bfloat16": "bf16", "float8_e4m3fn": "fp8"}[cache["kv_dtype"]] + ("_pb" if cache.get("scales") else "")
    digest = hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
    return f"sglang_h{data['model']['num_q_heads']}_n{data['tree']['max_nodes']}_{kv}_{digest}"


def _serves(rows: compat.KVRows, kv_dtype: str, page_size: int, dim: int) -> str:
    """What kgen reads, for the start-up log line."""
    if rows.scaled:
        fmt = f"fp8 e4m3 rows with per-block scales [slots, {rows.width}] uint8"
    else:
        fmt = f"{'bf16' if kv_dtype == 'bfloat16' else 'fp8 e4m3'} rows [slots, {dim}]"
    line = f"SGLang's {rows.pool}, {fmt}, page size {page_size}"
    if rows.pool == "DSATokenToKVPool":
        line += "; dense attention (DSA indexer off: every token attends to its whole prefix)"
    return line


# ---- the backend ---------------------------------------------------------------------------------


class _KgenMethods(BatchHooks):
    """KgenAttnBackend's own methods; backend_class() puts them in front of TritonAttnBackend."""

    is_kgen_backend = True  # how the defrag hook (sglang_defrag) knows kgen's backend without importing it

    def __init__(self, model_runner, *args, **kwargs):
        super().__init__(model_runner, *args, **kwargs)
        compat.check_instance(self, "TritonAttnBackend")
        self.kgen_rows = compat.kv_rows(self.token_to_kv_pool)
        try:
            self.kgen, said = _kgen_for_model(self, model_runner)
        except compat.SGLangError:
            raise
        except KgenError as e:  # an arch kgen has no plan for, a compile error, ...: serve with Triton
            self.kgen, said = None, f"{type(e).__name__}: {e}"
        self.kgen_off_reason, self.kgen_serves = ("", said) if self.kgen is not None else (said, "")
        if self.kgen is None:
            logger.warning("kgen backend: every mode runs on SGLang's Triton backend (%s)", self.kgen_off_reason)
        else:
            logger.info("kgen backend: TARGET_VERIFY and DECODE run on kgen (%s) over %s", self.kgen.module.spec.name,
                        self.kgen_serves)
        self.kgen_mode: str | None = None  # what the current batch's metadata prepared kgen for
        self._kgen_step = None
        self._kgen_graph_steps: dict[tuple, object] = {}

    def _kgen_init_graph(self, max_bs: int) -> None:
        self.kgen.init_graph(max_bs)
        self._kgen_graph_steps.clear()

    def _kgen_prepare(self, fb, *, graph: bool, capture: bool = False) -> None:
        """kgen's inputs and prepared step for this batch. In a CUDA graph the inputs are rewritten
        in place before each replay and the step prepared at capture is reused."""
        mode = kgen_mode(fb) if self.kgen is not None else None
        self.kgen_mode, self._kgen_step = mode, None
        if mode is None:
            return
        verify = mode == VERIFY
        bs = len(fb.req_pool_indices) if verify else fb.batch_size
        seq_lens, rows = fb.seq_lens[:bs], fb.req_pool_indices[:bs]
        n = compat.draft_tokens_per_request(self, fb.spec_info) if verify else 1

        def fill(kv_indptr, out):
            compat.gather_kv_indices(self, fb, rows, seq_lens, kv_indptr, out)

        capacity = None if graph or fb.seq_lens_sum is None else max(1, int(fb.seq_lens_sum))
        meta = self.kgen.plan(seq_lens, fill, tokens_per_req=n, verify=verify, graph=graph, capacity=capacity,
                              custom_mask=compat.verify_mask(fb) if verify else None)
        if not graph:
            self._kgen_step = self.kgen.prepare(meta, bs * n)
            return
        key = (mode, bs, n)
        if capture or key not in self._kgen_graph_steps:
            self._kgen_graph_steps[key] = self.kgen.prepare(meta, bs * n, graph=True)
        else:  # the replay's lengths were refilled in place: its schedule tables follow them
            self._kgen_graph_steps[key].reschedule()
        self._kgen_step = self._kgen_graph_steps[key]

    # -- forward: kgen for the prepared mode on the layers it serves, else Triton --
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._kgen_forward(VERIFY, super().forward_extend, q, k, v, layer, forward_batch, save_kv_cache,
                                  kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._kgen_forward(DECODE, super().forward_decode, q, k, v, layer, forward_batch, save_kv_cache,
                                  kwargs)

    def _kgen_forward(self, mode: str, triton, q, k, v, layer, fb, save_kv_cache: bool, kwargs: dict):
        """One layer of a batch prepared for `mode` on kgen, or the call as it came on Triton."""
        kv_scale = self._kgen_kv_scale(mode, layer, q, k, v, kwargs)
        if kv_scale is None:
            if self.kgen_rows is not None and self.kgen_rows.scaled and layer.qk_head_dim == self.kgen_rows.dim:
                raise ValueError(SCALED_ROWS_ON_TRITON.format(mode=fb.forward_mode.name, layer=layer.layer_id))
            return triton(q, k, v, layer, fb, save_kv_cache=save_kv_cache, **kwargs)
        if save_kv_cache:
            compat.save_kv(self, layer, fb, k, v)
        g = self.kgen
        out = compat.output_buffer(fb) if mode == VERIFY else None  # as Triton's forward_extend honours one
        if out is None:
            out = q.new_empty((q.shape[0], g.heads * g.vdim))
        kv_cache = compat.key_buffer(self, layer)
        rows, out_rows = q.view(-1, g.heads, g.dim), out.view(-1, g.heads, g.vdim)
        if mode == VERIFY:
            self._kgen_step.verify(rows, kv_cache, _tree_keys(kv_cache, k, fb, g.dim), kv_scale=kv_scale, out=out_rows)
        else:
            self._kgen_step.prefix(rows, kv_cache, kv_scale=kv_scale, out=out_rows)
        return out

    def _kgen_kv_scale(self, mode: str, layer, q, k, v, kwargs: dict) -> float | None:
        """The kv_scale kgen runs this layer's call with, or None: the call is Triton's. kgen takes it
        when the batch was prepared for `mode`, the layer is one kgen serves and the call passes no
        argument kgen does not implement (sinks, score_mod, ..., or any keyword a newer SGLang adds)."""
        if (self.kgen_mode != mode or k is None or v is None or q.dtype != torch.bfloat16
                or any(a is not None for a in kwargs.values()) or not self.kgen.serves(layer)):
            return None
        return self.kgen.kv_scale(layer)


def _tree_keys(kv_cache: torch.Tensor, k: torch.Tensor, fb, dim: int) -> torch.Tensor:
    """The tree tokens' keys for kgen: bf16 k for a bf16 pool; for an fp8 pool the rows its writer
    has stored at the tokens' slots (one gather, where quantizing k again took ~10 launches, and
    the bytes the prefix will read later)."""
    if kv_cache.dtype == torch.bfloat16:
        return k.view(-1, dim)
    return kv_cache.reshape(kv_cache.shape[0], -1)[fb.out_cache_loc]
