"""What the steps and ops of one module share on its device."""

from __future__ import annotations

from typing import Callable

import torch

from .tilemap import TileMaps

ZERO_LENS = 1024  # requests a tree-only call can have before the zero-lengths buffer grows


class DeviceState:
    """torch's current stream on the device (read at each launch), the flag the device checks of
    KGEN_VALIDATE report into, int32 zeros (the prefix lengths of tree-only calls) and the KV
    caches' tensor maps (kernels that copy whole tiles)."""

    def __init__(self, device: torch.device, stream: Callable[[], object]):
        self.device, self.stream = device, stream
        self.error_flag = torch.zeros(1, dtype=torch.int32, device=device)
        self._zeros = torch.zeros(ZERO_LENS, dtype=torch.int32, device=device)
        self.tile_maps = TileMaps()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # both are filled before any stream (a graph's) reads them

    def zero_lens(self, batch: int) -> torch.Tensor:
        """int32 zeros for at least `batch` requests. One buffer per module, grown outside graph
        capture (a step holds the one it packed)."""
        if self._zeros.numel() < batch:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"tree attention of {batch} requests: run it once before capturing a CUDA graph "
                                   f"(it needs a larger zero-filled buffer, and filling one is a launch)")
            self._zeros = torch.zeros(2 * batch, dtype=torch.int32, device=self.device)
        return self._zeros
