"""fp8 e4m3 KV: a stored byte means value = e4m3(byte) * kv_scale, one scale per cache tensor
(how SGLang stores an fp8 KV cache). Used by the ops (tree keys arrive in bf16) and the tests."""

from __future__ import annotations

import math

import torch

from .spec import SCALE_BLOCK

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
    """q [..., D] as e4m3 MMAs see it (cache.mma e4m3, templates/attention.cuh): each row's
    x * 448 / max|q| in float32 with one rounding (x * 448 is exact for bf16 x; nothing
    saturates), rounded to e4m3 (to nearest, ties to even), times max|q| / 448; float32."""
    x = q.float()
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    div = torch.where(amax > 0, amax, torch.full_like(amax, E4M3_MAX))
    return ((x * E4M3_MAX) / div).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * scale


# ---- SGLang's DSA pool rows (cache.scales: per_block; DESIGN §11) ----------------------------
# One row per token: kv_lora_rank e4m3 latent bytes | one fp32 scale per 128 latent dims (scale k
# multiplies dims 128k .. 128k+127) | qk_rope_head_dim bf16 rope values. GLM-5: 512 | 16 | 128 =
# 656 bytes. The byte order and the rounding are those of SGLang's writer for DSATokenToKVPool
# (sglang.kernels.ops.quantization.dsa_quant_k_cache, tests/test_fp8.py checks byte equality).

def quantize_rows(k: torch.Tensor, latent: int) -> torch.Tensor:
    """uint8 [N, kvrows.scaled_row_bytes] rows of bf16 keys k [N, latent + rope] (or [N, 1, ...]), SGLang's
    rule: per 128-dim block, scale = max|x| / 448 (fp32), byte = e4m3(clamp(x * (1 / scale), +-448));
    rope copied as bf16. An all-zero block gets scale 0 and zero bytes (it dequantizes to 0; SGLang's
    writer divides 0 by 0 there and stores what its float-to-e4m3 cast makes of NaN)."""
    k = k.reshape(-1, k.shape[-1])  # [N, D] or [N, 1, D]; N may be 0
    n, rope = k.shape[0], k.shape[1] - latent
    blocks = k[:, :latent].float().reshape(n, latent // SCALE_BLOCK, SCALE_BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / E4M3_MAX
    inv = torch.where(scale > 0, 1.0 / scale, 0.0)
    q = (blocks * inv).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return torch.cat([q.view(torch.uint8).reshape(n, latent), scale.reshape(n, latent // SCALE_BLOCK).view(torch.uint8),
                      k[:, latent:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(n, rope * 2)], dim=1)
