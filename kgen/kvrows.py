"""What one KV cache row of a spec is: its element type and bytes (DESIGN §4, §6).

The planner, the loop designs, the kernels' C signatures, the performance model and the
benchmarks all ask here, so a new row format is added in one place.
"""

from __future__ import annotations

from .spec import Spec

ELEM_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1}  # bytes per KV element, by cache.kv_dtype
CTYPES = {"bfloat16": "__nv_bfloat16", "float8_e4m3fn": "unsigned char"}  # C type of a KV element


def elem_bytes(spec: Spec) -> int:
    return ELEM_BYTES[spec.cache.kv_dtype]


def ctype(spec: Spec) -> str:
    return CTYPES[spec.cache.kv_dtype]


def row_bytes(spec: Spec) -> int:
    """Bytes of one latent row (key dims; values are its first value_dim dims)."""
    return spec.model.head_dim * elem_bytes(spec)
