"""One typed parameter list per kernel: it renders the C signature and packs launch arguments.

Keeping both in one place means a kernel can never be launched with arguments that disagree
with the C code it was compiled from (a Python int packed as a pointer, a float as a double).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

# C type -> ctypes type used to pack a scalar argument.
_SCALARS: dict[str, type] = {
    "int": ctypes.c_int32,
    "unsigned": ctypes.c_uint32,
    "long long": ctypes.c_int64,
    "float": ctypes.c_float,
}


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # e.g. "const __nv_bfloat16* __restrict__", "int", "float"

    @property
    def is_pointer(self) -> bool:
        return "*" in self.ctype

    def __post_init__(self) -> None:
        if not self.is_pointer and self.ctype not in _SCALARS:
            raise ValueError(f"parameter {self.name}: unsupported C type {self.ctype!r}")

    @property
    def c_decl(self) -> str:
        return f"{self.ctype} {self.name}"

    @property
    def ctypes_type(self) -> type:
        return ctypes.c_void_p if self.is_pointer else _SCALARS[self.ctype]


def c_signature(params: tuple[Param, ...]) -> str:
    return ",\n    ".join(p.c_decl for p in params)


def pack(params: tuple[Param, ...], values: dict[str, object]) -> tuple[tuple, tuple]:
    """(values, ctypes types) in the order of `params`, as cuLaunchKernel's kernelParams wants.

    Pointers are given as ints (device addresses) or objects with data_ptr() (torch tensors).
    """
    missing = [p.name for p in params if p.name not in values]
    extra = sorted(set(values) - {p.name for p in params})
    if missing or extra:
        raise TypeError(f"kernel arguments: missing {missing}, unexpected {extra}")
    out = []
    for p in params:
        v = values[p.name]
        if p.is_pointer:
            v = v.data_ptr() if hasattr(v, "data_ptr") else int(v)  # type: ignore[union-attr]
        elif p.ctype == "float":
            v = float(v)  # type: ignore[arg-type]
        else:
            v = int(v)  # type: ignore[call-overload]
        out.append(v)
    return tuple(out), tuple(p.ctypes_type for p in params)
