"""The adapter's part for kgen's DSA backend (KGEN_DSA=1, sglang_dsa.py): what that backend calls
of SGLang. Its names are sglang_names.DSA_NAMES, checked by sglang_compat.check(dsa=True) when the
backend is installed, against each supported release's source by tests/test_sglang_compat.py.
"""

from __future__ import annotations

from . import sglang_compat as compat


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
    return backend.dcp_size if compat.since("0.5.22") else 1


def dsa_page_table_1(backend):
    """The batch's token-level page table [rows, max_len] (a row per query token)."""
    return backend.forward_metadata.page_table_1


def save_dsa_kv(backend, layer, forward_batch, k, k_rope) -> None:
    """Store the batch's new latent rows (k_nope | k_rope) in the layer's DSA pool, as the DSA
    backend stores them."""
    backend.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
