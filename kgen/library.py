"""torch.ops.kgen.*: the ops as PyTorch custom ops with fake (meta) implementations, so that
torch.compile and torch.library.opcheck see through them.

The ops are per spec (their kernels are generated for it): each takes the spec's name, and
runs on the Module that kgen.jit(spec) registered for that name on the input's device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .spec import Spec

if TYPE_CHECKING:  # importing the ops (driver API, NVRTC) is not needed to define the custom ops
    from .ops import Module

_specs: dict[str, Spec] = {}
_modules: dict[tuple[str, int], Module] = {}


def register_spec(spec: Spec) -> None:
    """Make the fake implementations know `spec` (enough for tracing with fake tensors)."""
    if _specs.get(spec.name, spec) != spec:
        raise ValueError(f"spec_name: another spec named {spec.name!r} is already registered")
    _specs[spec.name] = spec


def register(module: Module) -> None:
    register_spec(module.spec)
    _modules[(module.spec.name, module.device.index)] = module


def module_for(spec_name: str, device: torch.device) -> Module:
    try:
        return _modules[(spec_name, device.index)]
    except KeyError:
        raise ValueError(f"spec_name: no kgen module {spec_name!r} on {device}; call kgen.jit(spec) first") from None


def _outputs_like(q: torch.Tensor, spec_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        value_dim = _specs[spec_name].model.value_dim
    except KeyError:
        raise ValueError(f"spec_name: unknown kgen spec {spec_name!r}; call kgen.jit(spec) first") from None
    o = q.new_empty((q.shape[0], q.shape[1], value_dim), dtype=torch.bfloat16)
    return o, q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


# The ops that run per layer are defined on a Library with their CUDA kernel and a fake one,
# not with torch.library.custom_op: its Python autograd and aliasing wrappers cost ~25 µs a call.
# Without an autograd kernel the dispatcher's fallback passes them straight through (they are
# not differentiable: outputs that would need a gradient only warn on backward).
_lib = torch.library.Library("kgen", "FRAGMENT")


def _op(fake):
    """Define kgen::<name> from the decorated function's annotations, as its CUDA kernel, with
    `fake` as its fake (meta) implementation."""
    def define(fn):
        _lib.define(fn.__name__ + torch.library.infer_schema(fn, mutates_args=()))
        _lib.impl(fn.__name__, fn, "CUDA")
        torch.library.register_fake(f"kgen::{fn.__name__}", fake, lib=_lib)
        return fn
    return define


def _verify_attention_fake(q, kv_cache, k_tree, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, spec_name,
                           kv_scale=1.0):
    return _outputs_like(q, spec_name)


@_op(_verify_attention_fake)
def verify_attention(q: torch.Tensor, kv_cache: torch.Tensor, k_tree: torch.Tensor, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens: torch.Tensor,
                     tree_mask: torch.Tensor | None, spec_name: str,
                     kv_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    return module_for(spec_name, q.device).verify_attention(q, kv_cache, k_tree, qo_indptr, kv_indptr, kv_indices,
                                                            kv_lens, tree_mask, kv_scale=kv_scale)


def _prefix_attention_fake(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, spec_name, kv_scale=1.0):
    return _outputs_like(q, spec_name)


@_op(_prefix_attention_fake)
def prefix_attention(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, kv_lens: torch.Tensor, spec_name: str,
                     kv_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    return module_for(spec_name, q.device).prefix_attention(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lens,
                                                            kv_scale=kv_scale)


def _tree_attention_fake(q, k_tree, qo_indptr, tree_mask, spec_name, kv_scale=1.0):
    return _outputs_like(q, spec_name)


@_op(_tree_attention_fake)
def tree_attention(q: torch.Tensor, k_tree: torch.Tensor, qo_indptr: torch.Tensor, tree_mask: torch.Tensor | None,
                   spec_name: str, kv_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    return module_for(spec_name, q.device).tree_attention(q, k_tree, qo_indptr, tree_mask, kv_scale=kv_scale)


def _merge_states_fake(o_a, lse_a, o_b, lse_b, spec_name):
    return torch.empty_like(o_a), torch.empty_like(lse_a)


@_op(_merge_states_fake)
def merge_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
                 spec_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return module_for(spec_name, o_a.device).merge_states(o_a, lse_a, o_b, lse_b)


# defrag mutates its caches: custom_op registers what that needs (version counters, functionalization).
@torch.library.custom_op("kgen::defrag", mutates_args=("kv_caches",))
def defrag(kv_caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor, stacked: bool, spec_name: str) -> None:
    """kv_caches: per-layer caches, or one stacked [layers, slots, D] tensor with stacked=True."""
    if stacked and len(kv_caches) != 1:
        raise ValueError(f"kv_caches: stacked=True takes one [layers, slots, D] tensor, got {len(kv_caches)}")
    module_for(spec_name, src.device).defrag(kv_caches[0] if stacked else list(kv_caches), src, dst)


@defrag.register_fake
def _(kv_caches, src, dst, stacked, spec_name):
    return None
