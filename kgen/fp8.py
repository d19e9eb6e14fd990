"""fp8 e4m3 KV: a stored byte means value = e4m3(byte) * kv_scale, one scale per cache tensor
(how SGLang stores an fp8 KV cache). Used by the ops (tree keys arrive in bf16) and the tests."""

from __future__ import annotations

import math

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def check_scale(kv_scale: object) -> float:
    if isinstance(kv_scale, bool) or not isinstance(kv_scale, (int, float)):
        raise TypeError(f"kv_scale: expected a Python float, got {type(kv_scale).__name__} "
                        f"(it is a launch argument; a tensor would need a host sync)")
    if not math.isfinite(kv_scale) or kv_scale <= 0:
        raise ValueError(f"kv_scale: expected a finite number > 0, got {kv_scale}")
    return float(kv_scale)


def quantize(x: torch.Tensor, kv_scale: float) -> torch.Tensor:
    """e4m3 bytes of x / kv_scale, saturated to +-448 (torch's cast would turn overflow into NaN)."""
    return (x.float() / kv_scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)


def dequantize(x: torch.Tensor, kv_scale: float) -> torch.Tensor:
    return x.to(torch.float64) * kv_scale


def e4m3_rows(q: torch.Tensor) -> torch.Tensor:
    """q [..., D] as e4m3 MMAs see it (cache.mma e4m3, templates/attention.cuh): each row times
    448 / max|q| in float32, rounded to e4m3 (so nothing saturates), scaled back; float32."""
    x = q.float()
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (x * (1 / scale)).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * scale
