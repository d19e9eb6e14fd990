"""The adapter between kgen's backend and SGLang's internals, which change from release to
release: every SGLang name the backend touches is in sglang_names.NAMES, checked here, and used
only through the bridge below.

Supported: SGLang 0.5.21, 0.5.22 and 0.5.23. `check()` runs when the backend is registered: an
other version, or a listed name that is missing or takes other parameters, is one
`SGLangError` line naming it and the supported versions — never an AttributeError in the middle
of a forward. Names an object carries only once built (a backend's or a layer's attributes) are
checked by `check_instance` when kgen's backend is created. tests/test_sglang_compat.py checks
NAMES against each supported release's own source.

What differs between the supported releases, and is bridged here:
- the KV-index gather: 0.5.21's `KVIndexTranslator.fill_packed_read_stream(...)` became
  `pack_read_stream(kv_loc_plan, ...)` in 0.5.22 (a ForwardBatch then carries `kv_loc_plan`);
- the KV write location: `KVWriteLoc(out_cache_loc)` in 0.5.21, `KVWriteLoc.for_batch(batch)`
  (which carries the batch's physical-id mark) from 0.5.22; the MLA writer `set_mla_kv_buffer`
  takes the slots themselves in 0.5.21, the write location from 0.5.22.

The same in all three: the DSA KV pool (`DSATokenToKVPool`: one [slots, 1, width] tensor per
layer, bf16 rows of 576 or fp8 "scaled" rows of 656 bytes), and server-arg resolution's plugin
hook (`register_resolution_hook`), through which kgen resolves speculative decoding as Triton
does (`resolve_speculative_as_triton`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from dataclasses import dataclass

import torch

from ..errors import KgenError
from .sglang_names import NAMES, PLAN_SINCE, SUPPORTED, Name

class SGLangError(KgenError, RuntimeError):
    """The installed SGLang is not one kgen's backend supports."""


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        raise SGLangError("sglang is not installed (kgen's backend supports sglang "
                          f"{', '.join(SUPPORTED)})") from None


def _fail(version: str, what: str) -> SGLangError:
    return SGLangError(f"sglang {version}: {what}; kgen's backend supports sglang {', '.join(SUPPORTED)}")


def _lookup(name: Name):
    """The named object; a dataclass field without a class-level default is None."""
    obj = importlib.import_module(name.module)
    *owners, attr = name.path.split(".")
    for part in owners:
        obj = getattr(obj, part)
    if not hasattr(obj, attr) and dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
        return None
    return getattr(obj, attr)


def _accepts(fn, params: tuple[str, ...]) -> str | None:
    """The first of `params` that `fn` does not accept, or None."""
    sig = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return next((p for p in params if p not in sig.parameters), None)


@functools.cache
def check(defrag: bool = False) -> str:
    """The installed SGLang's version, after checking it is supported and every name kgen's
    backend (and, with `defrag`, the defrag hook) uses exists and takes kgen's parameters."""
    version = installed_version()
    if version not in SUPPORTED:
        raise _fail(version, "this version is not supported, so the 'kgen' attention backend is not registered")
    for name in NAMES:
        if name.instance or version not in name.versions or (name.defrag and not defrag):
            continue
        try:
            importlib.import_module(name.module)
        except ImportError as e:
            raise _fail(version, f"importing {name.module} failed ({type(e).__name__}: {e})") from None
        try:
            obj = _lookup(name)
        except AttributeError:
            raise _fail(version, f"{name.module}.{name.path} is missing") from None
        missing = _accepts(obj, name.params) if name.params else None
        if missing:
            raise _fail(version, f"{name.module}.{name.path} takes no parameter {missing!r}")
    return version


def check_instance(obj, cls: str, defrag: bool = False) -> None:
    """`obj` (an instance of SGLang's `cls`, or an object standing in for one) carries every
    attribute kgen's backend (and, with `defrag`, the defrag hook) reads of a `cls`."""
    for name in NAMES:
        owner, _, attr = name.path.rpartition(".")
        if name.instance and (defrag or not name.defrag) and owner == cls and not hasattr(obj, attr):
            raise _fail(check(), f"a {cls} has no attribute {attr!r} (expected from {name.module})")


def since(release: str) -> bool:
    return _version_key(check()) >= _version_key(release)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")[:3])


# ---- the bridge: what kgen's backend calls ------------------------------------------------------


def register_backend(name: str, factory) -> None:
    """Add `name` to SGLang's --attention-backend choices and its attention registry."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if name not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([name])
    if name not in ATTENTION_BACKENDS:
        register_attention_backend(name)(factory)


def triton_backend_class() -> type:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend


def attention_layers(model) -> list:
    """The model's attention layers (SGLang's RadixAttention modules)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    return [m for m in model.modules() if isinstance(m, RadixAttention)]


@dataclass(frozen=True)
class KVRows:
    """How an SGLang MLA KV pool stores a token's latent row: one [slots, 1, width] tensor per
    layer, a slot is a row (the page size only shapes allocation)."""

    pool: str  # the pool's class name
    dim: int  # values per row: kv_lora_rank + qk_rope_head_dim (576)
    width: int  # elements per row: 576 (bf16 or fp8 e4m3), or 656 bytes for scaled rows
    scaled: bool  # fp8 with per-block scales: [e4m3 latent | fp32 scale per block | bf16 rope]
    block: int  # latent dims per scale (scaled rows)
    rope_dtype: object  # the rope values' dtype in scaled rows


def kv_rows(pool) -> KVRows | None:
    """The rows of SGLang's plain MLA pool or its DSA pool; None for any other pool (their
    subclasses too: HiSparse, layer-split and page-interleaved pools keep rows elsewhere)."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool

    if type(pool) not in (MLATokenToKVPool, DSATokenToKVPool):
        return None
    return KVRows(type(pool).__name__, pool.kv_lora_rank + pool.qk_rope_head_dim, int(pool.kv_cache_dim),
                  bool(pool.dsa_kv_cache_store_fp8),
                  DSATokenToKVPool.quant_block_size, DSATokenToKVPool.rope_storage_dtype)


def draft_tokens_per_request(backend, spec_info) -> int:
    """Query tokens per request of a TARGET_VERIFY batch (the capture width when spec_info is None)."""
    return backend._target_verify_num_tokens_per_req(spec_info)


def verify_mask(forward_batch):
    """SGLang's flat verify custom_mask of a TARGET_VERIFY batch, or None (a causal chain)."""
    spec_info = forward_batch.spec_info
    return None if spec_info is None else spec_info.custom_mask


def output_buffer(forward_batch):
    """A caller-provided attention output buffer, as the Triton backend honours it, or None."""
    return getattr(forward_batch, "_attn_output", None)


def gather_kv_indices(backend, forward_batch, req_pool_indices, seq_lens, kv_indptr, out) -> None:
    """Each request's token slots (req_to_token rows, through SGLang's KV-index translator, as the
    Triton backend gathers them) into `out` (int32) at `kv_indptr`; no host sync."""
    translator = backend.kv_index_translator
    if since(PLAN_SINCE):
        translator.pack_read_stream(forward_batch.kv_loc_plan, req_pool_indices=req_pool_indices,
                                    seq_lens=seq_lens, indptr=kv_indptr, out=out)
    else:
        translator.fill_packed_read_stream(req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                           indptr=kv_indptr, total_tokens=out.numel(), out=out)


def save_kv(backend, layer, forward_batch, k, v) -> None:
    """Store the batch's new latent rows in the layer's KV pool, as the Triton backend stores an
    MLA layer's: k / k_scale when the layer has a k_scale (a copy: the caller still reads k). A
    DSA pool of scaled fp8 rows (which that writer refuses) quantizes them with its own writer,
    as SGLang's MLA models store their latents there."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    plan = since(PLAN_SINCE)
    loc = KVWriteLoc.for_batch(forward_batch) if plan else KVWriteLoc(forward_batch.out_cache_loc)
    pool = backend.token_to_kv_pool
    if pool.dsa_kv_cache_store_fp8:
        r = pool.kv_lora_rank  # 0.5.21's writer takes the slots themselves
        pool.set_mla_kv_buffer(layer, loc if plan else forward_batch.out_cache_loc, k[..., :r], k[..., r:])
        return
    if layer.k_scale is not None:
        k = k.clone().div_(layer.k_scale)
    pool.set_kv_buffer(layer, loc, k, v)


def key_buffer(backend, layer):
    """The layer's latent cache [slots, 1, width] as stored: the kv dtype, or uint8 for scaled
    fp8 rows (the pool hands those out viewed as float8_e4m3fn)."""
    pool = backend.token_to_kv_pool
    rows = pool.get_key_buffer(layer.layer_id)
    return rows.view(torch.uint8) if pool.dsa_kv_cache_store_fp8 else rows


# ---- server-arg resolution --------------------------------------------------------------------

_BACKEND_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


@functools.cache
def resolve_speculative_as_triton(name: str) -> None:
    """Override SGLang's speculative-decoding resolution step (its plugin hook for named steps;
    once per process): where `name` is the attention backend (or a prefill/decode one), the step
    resolves as it does for "triton", and a speculative draft whose attention backend is not given
    gets "triton". `name`'s backend is Triton's in every mode but verify and decode, so Triton's
    draft path (at page size > 1 with topk > 1, its two-pass tree draft) and Triton's checks
    apply (e.g. topk > 1 at page size > 1, which SGLang allows for flashinfer, fa3 and triton)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolved_view
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    source = f"{name} (kgen): speculative decoding resolves as for triton"

    def handle_speculative_decoding(server_args, previous) -> None:
        view = resolved_view(server_args)
        ours = [f for f in _BACKEND_FIELDS if getattr(view, f) == name]
        if not ours:
            return previous(server_args)
        drafted = str(view.speculative_algorithm).upper() not in ("NONE", "NGRAM")  # a draft model's attention
        if drafted and view.speculative_draft_attention_backend is None:
            declare_resolution(server_args, source, speculative_draft_attention_backend="triton")
        declare_resolution(server_args, source, **dict.fromkeys(ours, "triton"))
        try:
            previous(server_args)
        finally:  # give the fields back to `name` (unless the step itself chose another backend)
            after = resolved_view(server_args)
            back = {f: name for f in ours if getattr(after, f) == "triton"}
            if back:
                declare_resolution(server_args, source, **back)

    try:
        register_resolution_hook("handle_speculative_decoding")(handle_speculative_decoding)
    except ValueError:  # not an overridable step in this build
        raise _fail(check(), "handle_speculative_decoding is not an overridable resolution step") from None


# ---- the opt-in defrag hook's view of the server ----------------------------------------------


def server_settings() -> tuple[bool, bool]:
    """(radix cache on, a speculative algorithm on) for this process's SGLang server."""
    from sglang.srt.runtime_context import get_memory, get_spec

    algorithm = get_spec().speculative_algorithm
    return not get_memory().disable_radix_cache, str(algorithm or "NONE").upper() != "NONE"


def is_plain_token_allocator(allocator) -> bool:
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    return type(allocator) is TokenToKVPoolAllocator
