"""defrag (DESIGN §5): for every layer and n, cache[dst[n]] = old cache[src[n]], as if all reads
happened before any write. Two launches per group of layers (templates/defrag.cuh): phase 0 stages
the rows of moves whose source another move overwrites, phase 1 writes every destination."""

from __future__ import annotations

import torch

from . import checks, env
from .kernels import DEFRAG
from .runtime import Kernel

STAGING_BYTES = env.integer("KGEN_DEFRAG_STAGING_BYTES", 1 << 30)  # staging per launch pair (layers grouped)


class Defrag:
    """The kv_defrag kernel of a module, and the device address tables of the layer lists it saw."""

    def __init__(self, kernel: Kernel, sm_count: int, device: torch.device):
        self._kernel, self._sm_count, self.device = kernel, sm_count, device
        self._layer_tables: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, kv_caches, src, dst) -> None:
        """For every layer and n: cache[dst[n]] = old cache[src[n]] (reads before writes)."""
        layers, num_slots, row_bytes = self._layer_table(kv_caches)
        if row_bytes % 16:
            raise ValueError(f"kv_caches: a row is {row_bytes} bytes; rows must be a multiple of 16 bytes")
        src = self._move_index("src", src)
        dst = self._move_index("dst", dst)
        if src.numel() != dst.numel():
            raise ValueError(f"src/dst: expected the same number of moves, got {src.numel()} and {dst.numel()}")
        n = src.numel()
        if n == 0:
            return
        if env.flag("KGEN_VALIDATE"):
            self._validate_moves(src, dst, num_slots)
        is_dst = torch.zeros(num_slots, dtype=torch.uint8, device=self.device)
        is_dst.index_fill_(0, dst, 1)  # a scalar fill: no host-to-device copy (graph capture)
        num_layers = layers.numel()
        row_chunks = row_bytes // 16
        group = max(1, min(num_layers, STAGING_BYTES // max(1, n * row_bytes)))
        staging = torch.empty(group * n * row_chunks, 4, dtype=torch.int32, device=self.device)
        kernel = self._kernel
        grid = DEFRAG.grid(n * row_chunks, kernel.variant.threads, self._sm_count)  # one thread per 16-byte chunk
        for first in range(0, num_layers, group):  # one launch pair for all layers unless staging is capped
            part = layers[first:first + group]
            for phase in (0, 1):
                kernel(grid, layers=part, src=src, dst=dst, is_dst=is_dst, staging=staging, n=n,
                       num_layers=part.numel(), row_chunks=row_chunks, phase=phase)

    def _layer_table(self, kv_caches) -> tuple[torch.Tensor, int, int]:
        """Device array of per-layer base addresses, slots per layer, bytes per row."""
        if isinstance(kv_caches, torch.Tensor):
            c = checks.tensor("kv_caches", kv_caches, dtype=kv_caches.dtype, device=self.device, ndim=kv_caches.dim())
            if c.dim() not in (3, 4) or (c.dim() == 4 and c.shape[2] != 1):
                raise ValueError(f"kv_caches: expected [layers, slots, D] (or [layers, slots, 1, D]), got {tuple(c.shape)}")
            row_bytes = c.shape[-1] * c.element_size()
            stride = c.stride(0) * c.element_size()
            table = c.data_ptr() + stride * torch.arange(c.shape[0], device=self.device, dtype=torch.int64)
            return table, c.shape[1], row_bytes
        if not isinstance(kv_caches, (list, tuple)) or not kv_caches:
            raise TypeError("kv_caches: expected a stacked [layers, slots, D] tensor or a non-empty list of tensors")
        first = kv_caches[0]
        if not isinstance(first, torch.Tensor):
            raise TypeError(f"kv_caches[0]: expected a torch.Tensor, got {type(first).__name__}")
        for i, c in enumerate(kv_caches):
            checks.tensor(f"kv_caches[{i}]", c, dtype=first.dtype, device=self.device, shape=tuple(first.shape))
        key = tuple(c.data_ptr() for c in kv_caches)
        if key not in self._layer_tables:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("defrag: call it once with this list of layers before capturing a CUDA graph "
                                   "(its address table is uploaded on first use), or pass a stacked tensor")
            self._layer_tables[key] = torch.tensor(key, dtype=torch.int64).to(self.device)
        return self._layer_tables[key], first.shape[0], first[0].numel() * first.element_size()

    def _move_index(self, name: str, t) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}")
        return t.to(device=self.device, dtype=torch.int64).contiguous()

    @staticmethod
    def _validate_moves(src: torch.Tensor, dst: torch.Tensor, num_slots: int) -> None:
        for name, t in (("src", src), ("dst", dst)):
            if bool(((t < 0) | (t >= num_slots)).any()):
                raise ValueError(f"{name}: slot index outside [0, {num_slots}) (KGEN_VALIDATE)")
        if torch.unique(dst).numel() != dst.numel():
            raise ValueError("dst: slots must be distinct (KGEN_VALIDATE)")
