"""One typed parameter list per kernel: it renders the C signature and packs launch arguments.

Keeping both in one place means a kernel can never be launched with arguments that disagree
with the C code it was compiled from (a Python int packed as a pointer, a float as a double).
"""

from __future__ import annotations

import ctypes
import struct
import sys
from dataclasses import dataclass

# C type -> (ctypes type, struct code) used to pack a scalar argument.
_SCALARS: dict[str, tuple[type, str]] = {
    "int": (ctypes.c_int32, "i"),
    "unsigned": (ctypes.c_uint32, "I"),
    "long long": (ctypes.c_int64, "q"),
    "float": (ctypes.c_float, "f"),
}
# C type -> bytes of an opaque by-value argument, packed from a bytes object: a TMA tensor map
# (templates/common.cuh TileMap, 128 bytes; the driver copies it into the parameter space).
_BLOBS: dict[str, int] = {"const __grid_constant__ kgen::TileMap": 128}


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # e.g. "const __nv_bfloat16* __restrict__", "int", "float"

    @property
    def is_pointer(self) -> bool:
        return "*" in self.ctype

    @property
    def is_blob(self) -> bool:
        return self.ctype in _BLOBS

    def __post_init__(self) -> None:
        if not self.is_pointer and self.ctype not in _SCALARS and not self.is_blob:
            raise ValueError(f"parameter {self.name}: unsupported C type {self.ctype!r}")

    @property
    def c_decl(self) -> str:
        return f"{self.ctype} {self.name}"

    @property
    def ctypes_type(self) -> type:
        if self.is_blob:
            return ctypes.c_ubyte * _BLOBS[self.ctype]
        return ctypes.c_void_p if self.is_pointer else _SCALARS[self.ctype][0]

    @property
    def struct_code(self) -> str:
        if self.is_blob:
            return f"{_BLOBS[self.ctype]}s"
        return "Q" if self.is_pointer else _SCALARS[self.ctype][1]


def c_signature(params: tuple[Param, ...]) -> str:
    return ",\n    ".join(p.c_decl for p in params)


class ParamLayout:
    """How one kernel's arguments are packed, worked out once per kernel: a ctypes struct with one
    field per parameter, and the same layout as a struct.Struct format (native alignment, as C
    lays the struct out) that packs all values in one call."""

    def __init__(self, params: tuple[Param, ...]):
        self.params = params
        self.names = tuple(p.name for p in params)
        self.struct = type("KernelArgs", (ctypes.Structure,), {"_fields_": [(p.name, p.ctypes_type) for p in params]})
        self.offsets = tuple(getattr(self.struct, p.name).offset for p in params)
        codes = "@" + "".join(p.struct_code for p in params)
        self.format = struct.Struct(codes)
        ends = [struct.calcsize("@" + "".join(p.struct_code for p in params[:i + 1]))  # where struct ends field i
                for i in range(len(params))]
        packed_at = tuple(end - struct.calcsize("@" + p.struct_code) for end, p in zip(ends, params))
        if packed_at != self.offsets:
            raise RuntimeError(f"struct and ctypes lay out {self.names} differently: {packed_at} vs {self.offsets}")
        self._name_set = frozenset(self.names)
        # A block's pointer array holds base + offsets[i] in 64-bit lane i: as one integer,
        # base * ones + offsets (no carries between lanes), built without a Python loop.
        self.pointer_array = ctypes.c_uint64 * len(params)
        self._ones = sum(1 << (64 * i) for i in range(len(params)))
        self._offsets = sum(off << (64 * i) for i, off in enumerate(self.offsets))
        self._pointers = tuple(i for i, p in enumerate(params) if p.is_pointer)
        self._scalars = tuple(i for i, p in enumerate(params) if not p.is_pointer and not p.is_blob)
        self._blobs = tuple((i, _BLOBS[p.ctype]) for i, p in enumerate(params) if p.is_blob)

    def pack(self, **values: object) -> ParamBlock:
        """A block holding `values`, by parameter name. A pointer is an int (a device address),
        None (NULL) or a torch tensor (its data_ptr()); a scalar is a Python int or float that
        fits its C type; a blob (a tensor map) is a bytes object of its exact size."""
        if values.keys() != self._name_set:
            missing = [n for n in self.names if n not in values]
            raise TypeError(f"kernel arguments: missing {missing}, unexpected {sorted(set(values) - self._name_set)}")
        row = [values[n] for n in self.names]
        for i in self._pointers:
            v = row[i]
            if type(v) is not int:
                row[i] = 0 if v is None else v.data_ptr()  # type: ignore[attr-defined]
        for i in self._scalars:
            if type(row[i]) not in (int, float):  # struct would take a one-element tensor's value as an int
                raise TypeError(f"kernel argument {self.names[i]}: expected a Python int or float, "
                                f"got {type(row[i]).__name__}")
        for i, size in self._blobs:
            if type(row[i]) is not bytes or len(row[i]) != size:
                raise TypeError(f"kernel argument {self.names[i]}: expected {size} bytes")
        block = ParamBlock(self)
        try:
            self.format.pack_into(block.values, 0, *row)
        except struct.error:
            for p, v in zip(self.params, row):
                try:
                    struct.pack("@" + p.struct_code, v)
                except struct.error as e:
                    raise ValueError(f"kernel argument {p.name}: {v!r} does not fit a C {p.ctype} ({e})") from None
            raise
        return block


class ParamBlock:
    """A kernel's launch arguments packed as cuLaunchKernel's kernelParams wants them: one C value
    per parameter (the fields of the ctypes struct `values`) and an array of pointers to those
    values, at `address`. Packed once (ParamLayout.pack), launched many times: assigning
    `values.<name>` rewrites one argument in place, and a launch passes `address` with nothing
    to convert.

    The driver copies the values at launch (and a CUDA graph at capture), so a block may be
    rewritten as soon as a launch returns. It holds addresses, not tensors: whoever packs a
    tensor's address keeps the tensor alive.
    """

    def __init__(self, layout: ParamLayout):
        self.values = layout.struct()
        base = ctypes.addressof(self.values)
        lanes = base * layout._ones + layout._offsets
        self._pointers = layout.pointer_array.from_buffer_copy(lanes.to_bytes(8 * len(layout.offsets), sys.byteorder))
        self.address = ctypes.addressof(self._pointers)
