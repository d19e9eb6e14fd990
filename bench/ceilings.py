"""The two ceilings the floor of every shape is built from, measured in the benchmark's own run.

- copy bandwidth: a large device-to-device copy, counting bytes read plus bytes written;
- mma.sync rate: bench/mma_peak.cu (independent bf16 -> fp32 m16n8k16 MMAs on register
  operands, all SMs busy), compiled through kgen's NVRTC path and launched with the driver API.
  Not cuBLAS: on Hopper that would use wgmma, which sm_120 lacks.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kgen.timing import events_ms

MMA_SOURCE = Path(__file__).with_name("mma_peak.cu")
MMA_FLOPS = 2 * 16 * 8 * 16  # one m16n8k16 MMA
MMA_NACC = 8  # independent accumulators per warp (NACC in mma_peak.cu)
MMA_THREADS = 256
MMA_BLOCKS_PER_SM = 4  # 32 warps per SM


@dataclass
class Ceilings:
    copy_tbps: float  # (bytes read + bytes written) / s / 1e12
    copy_bytes: int  # size of the copied buffer
    copy_ms: list[float]
    mma_tflops: float  # dense mma.sync bf16 -> fp32
    mma_flops: int  # per launch
    mma_ms: list[float]
    mma_grid: int
    mma_arch: str

    def as_dict(self) -> dict:
        return asdict(self)


def copy_bandwidth(device: torch.device, nbytes: int = 4 << 30, reps: int = 10) -> tuple[float, int, list[float]]:
    """Median device-to-device copy rate of an `nbytes` buffer, in TB/s of bytes read + written.
    Shrinks the buffer only if two of them do not fit in half of the free memory."""
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = min(nbytes, free // 4) // (1 << 20) * (1 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    ms = events_ms(lambda: dst.copy_(src), reps)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(ms) * 1e-3) / 1e12, nbytes, ms


class _MmaKernel:
    def __init__(self, device: torch.device):
        from cuda.bindings import driver

        from kgen.nvrtc import compile_cubin
        from kgen.runtime import check, ensure_context

        major, minor = torch.cuda.get_device_capability(device)
        self.arch = f"sm_{major}{minor}"
        compiled = compile_cubin(MMA_SOURCE.read_text(), {}, self.arch, "mma_peak", MMA_SOURCE.name)
        ensure_context(device)
        self._driver, self._check, self.device = driver, check, device
        self._module = check(driver.cuModuleLoadData(compiled.cubin), "loading mma_peak")
        self._func = check(driver.cuModuleGetFunction(self._module, b"mma_peak"), "finding mma_peak")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.grid = sms * MMA_BLOCKS_PER_SM
        self.out = torch.empty(self.grid * MMA_THREADS, dtype=torch.float32, device=device)

    def flops(self, iters: int) -> int:
        return self.grid * (MMA_THREADS // 32) * iters * MMA_NACC * MMA_FLOPS

    def __call__(self, iters: int) -> None:
        d = self._driver
        stream = d.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        args = ((self.out.data_ptr(), iters), (ctypes.c_void_p, ctypes.c_int32))
        self._check(d.cuLaunchKernel(self._func, self.grid, 1, 1, MMA_THREADS, 1, 1, 0, stream, args, 0),
                    "launching mma_peak")


def mma_rate(device: torch.device, target_ms: float = 5.0, reps: int = 10):
    """Median mma.sync bf16 -> fp32 rate in TFLOP/s, with launches of about target_ms each."""
    kernel = _MmaKernel(device)
    iters = 1024
    ms = statistics.median(events_ms(lambda: kernel(iters), 3))
    iters = max(1024, int(iters * target_ms / max(ms, 1e-3)))
    ms = events_ms(lambda: kernel(iters), reps)
    flops = kernel.flops(iters)
    return flops / (statistics.median(ms) * 1e-3) / 1e12, flops, ms, kernel.grid, kernel.arch


def measure(device: torch.device) -> Ceilings:
    copy_tbps, copy_bytes, copy_ms = copy_bandwidth(device)
    mma_tflops, mma_flops, mma_ms, grid, arch = mma_rate(device)
    return Ceilings(copy_tbps, copy_bytes, copy_ms, mma_tflops, mma_flops, mma_ms, grid, arch)
