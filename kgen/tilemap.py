"""A layer's KV cache as a TMA tensor map, for kernels that stage a tile of consecutive slots with
tensor copies (templates/attention.cuh stage_range, wgmma_ring.cuh wg_produce; designs' tile_box says which
kernels).

The map is 2-D: 8-byte elements along a row (row_bytes / 8 of them), slots along the other axis.
Its box (kgen.designs.base.TileBox) is `rows` slots by box_bytes / 8 elements from a row's start: a
staged row (the mma.sync loop's), the cache row and its padding, which the copy fills with zeros (box
columns past the row's end are out of bounds), or the part of an fp8 row the sm_90 loops' producer
converts (a DSA row's latent); or, swizzled, one 128-byte column block (the sm_90 loops' bf16 ring,
one copy per block). A map names the cache's address, so each layer has its own; a server passes the
same few caches every step, so maps are made once per (address, slots, box) and kept (`TileMaps`,
bounded).
"""

from __future__ import annotations

import ctypes
import struct
from collections import OrderedDict

MAP_BYTES = 128  # sizeof(CUtensorMap)
TileMapBytes = ctypes.c_ubyte * MAP_BYTES  # what a kernel's kv_map argument field takes (kgen.signature)
EMPTY = bytes(MAP_BYTES)  # a block's kv_map before its first layer
_MAPS_KEPT = 1024  # maps a process keeps: every layer of a few models' caches


def encode(address: int, slots: int, row_bytes: int, box_bytes: int, rows: int, swizzle128: bool = False) -> bytes:
    """The tensor map (CUtensorMap bytes) of a cache of `slots` rows of `row_bytes` at `address`,
    boxed as `rows` rows of `box_bytes` (swizzle128: 128-byte column blocks, swizzled)."""
    fits = box_bytes == 128 and row_bytes % 128 == 0 if swizzle128 else box_bytes <= 2048
    if address % 16 or row_bytes % 16 or box_bytes % 16 or not fits:
        raise ValueError(f"tile map: a cache at {address:#x} with {row_bytes}-byte rows cannot be tensor-copied in "
                         f"{'swizzled ' if swizzle128 else ''}{box_bytes}-byte boxes (16-byte aligned rows; "
                         "boxes of at most 2048 bytes from a row's start, or 128-byte column blocks)")
    if not 0 < slots < 2**31 or not 0 < rows <= 256:
        raise ValueError(f"tile map: {slots} slots in boxes of {rows} rows is outside what a tensor copy addresses")
    from cuda.bindings import driver

    from .runtime import check

    u32, u64 = driver.cuuint32_t, driver.cuuint64_t
    tensor_map = check(driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, address,
        [u64(row_bytes // 8), u64(slots)], [u64(row_bytes)], [u32(box_bytes // 8), u32(rows)], [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle128 else
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return struct.pack(f"{MAP_BYTES // 8}Q", *(int(w) for w in tensor_map.opaque))


class TileMaps:
    """Tensor maps by (address, slots, row bytes, box bytes, rows, swizzled), made on first use, as the argument
    field's type so that a call assigns one without converting it; the least recently used go first."""

    def __init__(self, kept: int = _MAPS_KEPT):
        self._maps: OrderedDict[tuple[int, int, int, int, int, bool], TileMapBytes] = OrderedDict()
        self._kept = kept

    def get(self, address: int, slots: int, row_bytes: int, box_bytes: int, rows: int,
            swizzle128: bool) -> TileMapBytes:
        key = (address, slots, row_bytes, box_bytes, rows, swizzle128)
        found = self._maps.get(key)
        if found is None:
            found = self._maps[key] = TileMapBytes.from_buffer_copy(encode(*key))
            if len(self._maps) > self._kept:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(key)
        return found
