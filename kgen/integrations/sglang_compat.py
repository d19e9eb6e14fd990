"""Every SGLang name the kgen backend touches, in one place: the adapter between kgen and
SGLang's internals, which change from release to release.

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
  (which carries the batch's physical-id mark) from 0.5.22.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from dataclasses import dataclass

from ..errors import KgenError

SUPPORTED = ("0.5.21", "0.5.22", "0.5.23")
PLAN_SINCE = "0.5.22"  # ForwardBatch.kv_loc_plan, pack_read_stream, KVWriteLoc.for_batch


class SGLangError(KgenError, RuntimeError):
    """The installed SGLang is not one kgen's backend supports."""


@dataclass(frozen=True)
class Name:
    """`path` in `module`: a module attribute or `Class.attr`. `params`: the parameters kgen
    passes (a callable must accept them). `instance`: an attribute set on the object in a method
    (`self.x = ...`), checked on a built object. `versions`: the releases whose bridge uses it.
    `defrag`: used only by the opt-in defrag hook (KGEN_DEFRAG=1). `dsa`: used only by kgen's
    opt-in DSA backend (KGEN_DSA=1, sglang_dsa.py)."""

    module: str
    path: str
    params: tuple[str, ...] = ()
    instance: bool = False
    versions: tuple[str, ...] = SUPPORTED
    defrag: bool = False
    dsa: bool = False


def _names(module: str, *paths: str, **kw) -> tuple[Name, ...]:
    return tuple(Name(module, p, **kw) for p in paths)


_TRITON = "sglang.srt.layers.attention.triton_backend"
_POOL = "sglang.srt.mem_cache.memory_pool"
_BATCH = "sglang.srt.model_executor.forward_batch_info"
_METHOD = ("q", "k", "v", "layer", "forward_batch", "save_kv_cache")

# ---- kgen's DSA backend (KGEN_DSA=1, sglang_dsa.py): checked only when it is installed ----------
_DSA = "sglang.srt.layers.attention.dsa_backend"
_DSA_META = "sglang.srt.layers.attention.dsa.dsa_indexer_metadata"
_DSA_METHOD = (*_METHOD, "q_rope", "k_rope", "topk_indices")
DSA_NAMES: tuple[Name, ...] = tuple(dataclasses.replace(n, dsa=True) for n in (
    # registration: the registry's "dsa" entry, the server-arg resolution step kgen wraps
    Name("sglang.srt.layers.attention.attention_registry", "ATTENTION_BACKENDS"),
    Name("sglang.srt.arg_groups.resolution_hooks", "register_resolution_hook", ("name",)),
    Name("sglang.srt.arg_groups.speculative_hook", "handle_speculative_decoding", ("server_args",)),
    Name("sglang.srt.arg_groups.overrides", "declare_resolution", ("server_args", "source")),
    Name("sglang.srt.arg_groups.model_override_base", "resolved_view", ("server_args",)),
    # the DSA backend kgen's extends, and what kgen reads of it
    Name(_DSA, "DeepseekSparseAttnBackend.__init__", ("model_runner",)),
    Name(_DSA, "DeepseekSparseAttnBackend.init_forward_metadata", ("forward_batch",)),
    Name(_DSA, "DeepseekSparseAttnBackend.init_cuda_graph_state", ("max_bs", "max_num_tokens")),
    Name(_DSA, "DeepseekSparseAttnBackend.init_forward_metadata_out_graph", ("forward_batch", "in_capture")),
    Name(_DSA, "DeepseekSparseAttnBackend.forward_extend", _DSA_METHOD),
    Name(_DSA, "DeepseekSparseAttnBackend.forward_decode", _DSA_METHOD),
    Name(_DSA, "DeepseekSparseAttnBackend.get_indexer_metadata", ("layer_id", "forward_batch")),
    *_names(_DSA, *(f"DeepseekSparseAttnBackend.{a}" for a in (
        "token_to_kv_pool", "forward_metadata", "use_fused_topk", "dsa_kv_cache_store_fp8", "dsa_index_topk",
        "speculative_num_draft_tokens", "topk", "hisparse_coordinator")), instance=True),
    Name(_DSA, "DeepseekSparseAttnBackend.dcp_size", instance=True, versions=SUPPORTED[1:]),
    Name(_DSA, "DSAMetadata.page_table_1"),
    # the indexer's metadata, whose top-k kgen makes tree-aware
    Name(_DSA_META, "DSAIndexerMetadata.topk_transform", ("logits", "topk")),
    Name(_DSA_META, "DSAIndexerMetadata.attn_metadata"),
    # the pool: its class, writing the new latent rows (k_nope | k_rope) as the DSA backend does
    Name(_POOL, "DSATokenToKVPool"),
    Name(_POOL, "MLATokenToKVPool.set_mla_kv_buffer", ("layer",)),
    Name("sglang.srt.model_executor.model_runner", "ModelRunner.is_draft_worker", instance=True),
    Name("sglang.srt.model_executor.model_runner", "ModelRunner.page_size", instance=True),
))

NAMES: tuple[Name, ...] = (
    # registration: the attention registry and the CLI choices
    *_names("sglang.srt.arg_groups.choices", "ATTENTION_BACKEND_CHOICES"),
    Name("sglang.srt.arg_groups.choices", "add_attention_backend_choices"),
    *_names("sglang.srt.layers.attention.attention_registry", "ATTENTION_BACKENDS"),
    Name("sglang.srt.layers.attention.attention_registry", "register_attention_backend", ("name",)),
    # the Triton backend kgen's backend extends, and what kgen reads of it
    Name(_TRITON, "TritonAttnBackend.__init__", ("model_runner",)),
    Name(_TRITON, "TritonAttnBackend.init_forward_metadata", ("forward_batch",)),
    Name(_TRITON, "TritonAttnBackend.init_cuda_graph_state", ("max_bs", "max_num_tokens")),
    Name(_TRITON, "TritonAttnBackend.init_forward_metadata_out_graph", ("forward_batch", "in_capture")),
    Name(_TRITON, "TritonAttnBackend.forward_extend", _METHOD),
    Name(_TRITON, "TritonAttnBackend.forward_decode", _METHOD),
    Name(_TRITON, "TritonAttnBackend._target_verify_num_tokens_per_req", ("spec_info",)),
    *_names(_TRITON, *(f"TritonAttnBackend.{a}" for a in (
        "use_mla", "dcp_size", "enable_deterministic", "sliding_window_size", "num_draft_tokens",
        "max_context_len", "kv_index_translator", "token_to_kv_pool", "page_size")), instance=True),
    # gathering a batch's KV slots, writing its new rows
    Name("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.fill_packed_read_stream",
         ("req_pool_indices", "seq_lens", "indptr", "total_tokens", "out"), versions=SUPPORTED[:1]),
    Name("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.pack_read_stream",
         ("plan", "req_pool_indices", "seq_lens", "indptr", "out"), versions=SUPPORTED[1:]),
    Name(_POOL, "KVWriteLoc", ("loc",), versions=SUPPORTED[:1]),
    Name(_POOL, "KVWriteLoc.for_batch", ("forward_batch",), versions=SUPPORTED[1:]),
    Name(_POOL, "MLATokenToKVPool.set_kv_buffer", ("layer", "loc_info", "cache_k", "cache_v")),
    Name(_POOL, "MLATokenToKVPool.get_key_buffer", ("layer_id",)),
    # the forward batch and its verify input
    *_names(_BATCH, *(f"ForwardBatch.{a}" for a in (
        "forward_mode", "batch_size", "req_pool_indices", "seq_lens", "seq_lens_sum", "out_cache_loc",
        "spec_info"))),
    Name(_BATCH, "ForwardBatch.kv_loc_plan", versions=SUPPORTED[1:]),
    *_names(_BATCH, "ForwardMode.is_target_verify", "ForwardMode.is_decode"),
    Name("sglang.srt.speculative.eagle_info", "EagleVerifyInput.custom_mask"),
    # the model: its attention layers, its config
    Name("sglang.srt.layers.radix_attention", "RadixAttention"),
    *_names("sglang.srt.layers.radix_attention", *(f"RadixAttention.{a}" for a in (
        "layer_id", "tp_q_head_num", "tp_k_head_num", "qk_head_dim", "v_head_dim", "scaling", "logit_cap",
        "sliding_window_size", "is_cross_attention", "xai_temperature_len", "k_scale", "v_scale", "k_scale_float",
        "v_scale_float")), instance=True),
    *_names("sglang.srt.model_executor.model_runner", *(f"ModelRunner.{a}" for a in (
        "model", "model_config", "kv_cache_dtype", "token_to_kv_pool")), instance=True),
    *_names("sglang.srt.configs.model_config", "ModelConfig.kv_lora_rank", "ModelConfig.qk_rope_head_dim",
            instance=True),
    # the opt-in defrag hook (KGEN_DEFRAG=1)
    Name("sglang.srt.plugins.hook_registry", "HookRegistry.register", ("target", "hook", "hook_type"), defrag=True),
    Name("sglang.srt.plugins.hook_registry", "HookType.BEFORE", defrag=True),
    Name("sglang.srt.model_executor.model_runner", "ModelRunner.forward", ("forward_batch",), defrag=True),
    *_names("sglang.srt.model_executor.model_runner", *(f"ModelRunner.{a}" for a in (
        "token_to_kv_pool_allocator", "req_to_token_pool", "page_size", "attn_backend")), instance=True,
        defrag=True),
    Name("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator.free", ("free_index",), defrag=True),
    *_names("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator.free_pages",
            "TokenToKVPoolAllocator.release_pages", instance=True, defrag=True),
    *_names(_POOL, "MLATokenToKVPool.kv_buffer", "ReqToTokenPool.req_to_token", instance=True, defrag=True),
    *_names("sglang.srt.runtime_context", "get_memory", "get_spec", defrag=True),
    *DSA_NAMES,
)


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
def check(defrag: bool = False, dsa: bool = False) -> str:
    """The installed SGLang's version, after checking it is supported and every name kgen's
    backend (and, with `defrag`, the defrag hook; with `dsa`, kgen's DSA backend) uses exists and
    takes kgen's parameters."""
    version = installed_version()
    if version not in SUPPORTED:
        raise _fail(version, "this version is not supported, so the 'kgen' attention backend is not registered")
    for name in NAMES:
        if (name.instance or version not in name.versions or (name.defrag and not defrag)
                or (name.dsa and not dsa)):
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


def check_instance(obj, cls: str, defrag: bool = False, dsa: bool = False) -> None:
    """`obj` (an instance of SGLang's `cls`, or an object standing in for one) carries every
    attribute kgen's backend (and, with `defrag`, the defrag hook; with `dsa`, kgen's DSA backend)
    reads of a `cls` in the installed release."""
    version = check()
    for name in NAMES:
        owner, _, attr = name.path.rpartition(".")
        if (name.instance and (defrag or not name.defrag) and (dsa or not name.dsa) and owner == cls
                and version in name.versions and not hasattr(obj, attr)):
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


def is_plain_mla_pool(pool) -> bool:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return type(pool) is MLATokenToKVPool


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
    MLA layer's: k / k_scale when the layer has a k_scale (a copy: the caller still reads k)."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    loc = KVWriteLoc.for_batch(forward_batch) if since(PLAN_SINCE) else KVWriteLoc(forward_batch.out_cache_loc)
    if layer.k_scale is not None:
        k = k.clone().div_(layer.k_scale)
    backend.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)


def key_buffer(backend, layer):
    """The layer's latent cache [slots, 1, D] (kv dtype)."""
    return backend.token_to_kv_pool.get_key_buffer(layer.layer_id)


# ---- the opt-in defrag hook's view of the server ----------------------------------------------


def server_settings() -> tuple[bool, bool]:
    """(radix cache on, a speculative algorithm on) for this process's SGLang server."""
    from sglang.srt.runtime_context import get_memory, get_spec

    algorithm = get_spec().speculative_algorithm
    return not get_memory().disable_radix_cache, str(algorithm or "NONE").upper() != "NONE"


def is_plain_token_allocator(allocator) -> bool:
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    return type(allocator) is TokenToKVPoolAllocator


# ---- kgen's DSA backend's view of SGLang (KGEN_DSA=1, sglang_dsa.py) ------------------------------


def backend_factory(name: str):
    """The attention registry's factory for `name`."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    return ATTENTION_BACKENDS[name]


def replace_backend(name: str, factory) -> None:
    """Make `factory` the attention registry's entry for `name` (a backend SGLang already has)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    ATTENTION_BACKENDS[name] = factory


def register_resolution_hook(step: str, hook) -> None:
    """Wrap SGLang's server-arg resolution step `step` with hook(server_args, previous)."""
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook as register

    register(step)(hook)


def resolved_view(server_args):
    """What SGLang's resolution has decided so far (read-only)."""
    from sglang.srt.arg_groups.model_override_base import resolved_view as view

    return view(server_args)


def declare_resolution(server_args, source: str, **fields) -> None:
    """Decide server-arg fields during resolution (the last declaration wins)."""
    from sglang.srt.arg_groups.overrides import declare_resolution as declare

    declare(server_args, source, **fields)


def dsa_backend_class() -> type:
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    return DeepseekSparseAttnBackend


def dsa_indexer_metadata_class() -> type:
    from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata

    return DSAIndexerMetadata


def is_draft_runner(model_runner) -> bool:
    return bool(model_runner.is_draft_worker)


def is_dsa_pool(pool) -> bool:
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    return isinstance(pool, DSATokenToKVPool)


def dsa_dcp_size(backend) -> int:
    """Decode context parallelism of a DSA backend (0.5.21's has none)."""
    return backend.dcp_size if since("0.5.22") else 1


def dsa_page_table_1(backend):
    """The batch's token-level page table [rows, max_len] (a row per query token)."""
    return backend.forward_metadata.page_table_1


def save_dsa_kv(backend, layer, forward_batch, k, k_rope) -> None:
    """Store the batch's new latent rows (k_nope | k_rope) in the layer's DSA pool, as the DSA
    backend stores them."""
    backend.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
