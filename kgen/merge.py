"""merge_states (DESIGN §5): two attention states of the same rows merged as if their key sets
were united, by the lse_merge kernel of the state's dtype."""

from __future__ import annotations

import torch

from . import checks
from .kernels import MERGE
from .runtime import Kernel


def merge_states(kernels: dict[str, Kernel], sm_count: int, device: torch.device, o_a, lse_a, o_b, lse_b, *,
                 out=None, lse=None):
    """kernels: a plan's kernels by variant name (lse_merge_bf16, lse_merge_f32)."""
    if not isinstance(o_a, torch.Tensor):
        raise TypeError(f"o_a: expected a torch.Tensor, got {type(o_a).__name__}")
    if o_a.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"o_a: expected dtype torch.bfloat16 or torch.float32, got {o_a.dtype}")
    shape = tuple(o_a.shape)
    if len(shape) < 2 or shape[-1] % 8:
        raise ValueError(f"o_a: expected [..., width] with width a multiple of 8, got shape {shape}")
    o_a = checks.tensor("o_a", o_a, dtype=o_a.dtype, device=device, shape=shape)
    o_b = checks.tensor("o_b", o_b, dtype=o_a.dtype, device=device, shape=shape)
    lse_a = checks.tensor("lse_a", lse_a, dtype=torch.float32, device=device, shape=shape[:-1])
    lse_b = checks.tensor("lse_b", lse_b, dtype=torch.float32, device=device, shape=shape[:-1])
    out = checks.out_tensor("out", out, shape=shape, dtype=o_a.dtype, device=device)
    lse = checks.out_tensor("lse", lse, shape=shape[:-1], dtype=torch.float32, device=device)
    rows = lse_a.numel()
    kernel = kernels[f"{MERGE.name}_{'bf16' if o_a.dtype == torch.bfloat16 else 'f32'}"]
    grid = MERGE.grid(rows * (shape[-1] // 8), kernel.variant.threads, sm_count)  # one thread per 8-wide vector
    kernel(grid, o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b, o=out, lse=lse, rows=rows, width=shape[-1])
    return out, lse
