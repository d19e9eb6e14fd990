"""What one KV cache row of a spec is: its element type and bytes (DESIGN §4, §6).

The planner, the loop designs, the kernels' C signatures, the performance model and the
benchmarks all ask here, so a new row format is added in one place.
"""

from __future__ import annotations

from .spec import SCALE_BLOCK, Spec

ELEM_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1}  # bytes per KV element, by cache.kv_dtype
CTYPES = {"bfloat16": "__nv_bfloat16", "float8_e4m3fn": "unsigned char"}  # C type of a KV element


def elem_bytes(spec: Spec) -> int:
    return ELEM_BYTES[spec.cache.kv_dtype]


def ctype(spec: Spec) -> str:
    return CTYPES[spec.cache.kv_dtype]


def row_bytes(spec: Spec) -> int:
    """Bytes of one latent row (key dims; values are its first value_dim dims): D elements of the KV
    type, or a DSA pool row (cache.scales per_block: e4m3 latent | fp32 block scales | bf16 rope)."""
    m = spec.model
    if spec.cache.per_block:
        return scaled_row_bytes(m.kv_lora_rank, m.qk_rope_head_dim)
    return m.head_dim * elem_bytes(spec)


def scaled_row_bytes(latent: int, rope: int) -> int:
    """Bytes of a DSA pool row: e4m3 latent, one fp32 scale per SCALE_BLOCK dims, bf16 rope (§11)."""
    return latent + latent // SCALE_BLOCK * 4 + rope * 2


def staged_stride(row: int, pad: int) -> int:
    """A staged KV row's stride: an odd number of 16-byte chunks, so ldmatrix's 8 row addresses of
    an 8x8 matrix fall in 8 different bank groups (a 656-byte DSA row already is: no padding)."""
    return row + (0 if (row // 16) % 2 else pad)
