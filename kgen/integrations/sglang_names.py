"""The SGLang names kgen's backend touches (sglang_compat.py checks them and bridges the releases):
a module attribute, a class attribute or method, a dataclass field, or an attribute a method sets
on `self`, with the parameters kgen passes and the releases whose bridge uses it.
tests/test_sglang_compat.py checks NAMES against each supported release's own source.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED = ("0.5.21", "0.5.22", "0.5.23")
PLAN_SINCE = "0.5.22"  # ForwardBatch.kv_loc_plan, pack_read_stream, KVWriteLoc.for_batch



@dataclass(frozen=True)
class Name:
    """`path` in `module`: a module attribute or `Class.attr`. `params`: the parameters kgen
    passes (a callable must accept them). `instance`: an attribute set on the object in a method
    (`self.x = ...`), checked on a built object. `versions`: the releases whose bridge uses it.
    `defrag`: used only by the opt-in defrag hook (KGEN_DEFRAG=1)."""

    module: str
    path: str
    params: tuple[str, ...] = ()
    instance: bool = False
    versions: tuple[str, ...] = SUPPORTED
    defrag: bool = False


def _names(module: str, *paths: str, **kw) -> tuple[Name, ...]:
    return tuple(Name(module, p, **kw) for p in paths)


_TRITON = "sglang.srt.layers.attention.triton_backend"
_ARGS = "sglang.srt.arg_groups"
_POOL = "sglang.srt.mem_cache.memory_pool"
_BATCH = "sglang.srt.model_executor.forward_batch_info"
_METHOD = ("q", "k", "v", "layer", "forward_batch", "save_kv_cache")

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
    # None: SGLang's DSA indexer picks no top-k for this backend, so a DSA model's attention is dense
    Name(_TRITON, "TritonAttnBackend.get_indexer_metadata", ("layer_id", "forward_batch")),
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
    # the DSA pool (GLM-5, DeepSeek-V3.2): its rows, and SGLang's own writer of its scaled fp8 rows
    Name(_POOL, "DSATokenToKVPool"),
    *_names(_POOL, "DSATokenToKVPool.quant_block_size", "DSATokenToKVPool.rope_storage_dtype"),
    Name(_POOL, "MLATokenToKVPool.set_mla_kv_buffer", ("layer", "loc", "cache_k_nope", "cache_k_rope"),
         versions=SUPPORTED[:1]),
    Name(_POOL, "MLATokenToKVPool.set_mla_kv_buffer", ("layer", "loc_info", "cache_k_nope", "cache_k_rope"),
         versions=SUPPORTED[1:]),
    *_names(_POOL, *(f"MLATokenToKVPool.{a}" for a in ("kv_cache_dim", "kv_lora_rank", "qk_rope_head_dim",
                                                     "dsa_kv_cache_store_fp8")),
            instance=True),
    # server-arg resolution: kgen's speculative-decoding step (topk > 1 trees at page size > 1)
    Name(f"{_ARGS}.resolution_hooks", "register_resolution_hook", ("name",)),
    Name(f"{_ARGS}.speculative_hook", "handle_speculative_decoding", ("server_args",)),
    Name(f"{_ARGS}.overrides", "declare_resolution", ("server_args", "source")),
    Name(f"{_ARGS}.overrides", "resolved_view", ("server_args",)),
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
)
