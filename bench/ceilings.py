"""The ceilings the floors of every shape are built from, measured in the benchmark's own run.

- copy bandwidth: a large device-to-device copy, counting bytes read plus bytes written;
- mma.sync rate: bench/mma_peak.cu (independent bf16 -> fp32 m16n8k16 MMAs on register
  operands, all SMs busy), compiled through kgen's NVRTC path and launched with the driver API.
  Not cuBLAS: on Hopper that would use wgmma, which sm_120 lacks. The floor the project has
  always used (what sm_120 has).
- dense GEMM rate: the arch's fastest dense bf16 path, a large cuBLAS GEMM through torch.matmul
  (on Hopper wgmma: ~775 TFLOP/s on the H200 against ~640 for mma.sync). The second compute
  floor (DESIGN §9): a Hopper plan uses wgmma, so it is measured against both.

bench/model_validate.py also measures the fp8 conversion rate (bench/cvt_peak.cu), a rate of the
performance model (kgen/model.py).
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
CVT_SOURCE = Path(__file__).with_name("cvt_peak.cu")
CVT_CHAINS = 8  # independent conversions per thread and iteration (CHAINS in cvt_peak.cu)
PEAK_THREADS = 256
PEAK_BLOCKS_PER_SM = 4  # 32 warps per SM


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
    gemm_tflops: float  # dense bf16 GEMM (cuBLAS) on random data
    gemm_n: int  # an n x n x n product
    gemm_ms: list[float]

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


class SourceKernel:
    """A bench kernel `name(...)` from `source` (with `headers` and NVRTC `options`), compiled for the
    device's arch through kgen's NVRTC path and loaded with the driver API; launched on torch's
    current stream. `smem_limit`: the dynamic shared memory its launches may ask for."""

    def __init__(self, device: torch.device, source: Path, name: str, headers: dict[str, str] | None = None,
                 options: tuple[str, ...] = (), smem_limit: int = 0):
        from cuda.bindings import driver

        from kgen.nvrtc import compile_cubin
        from kgen.runtime import check, ensure_context

        major, minor = torch.cuda.get_device_capability(device)
        self.arch, self.name, self.device = f"sm_{major}{minor}", name, device
        compiled = compile_cubin(source.read_text(), headers or {}, self.arch, name, source.name, options)
        self.report = compiled.report
        ensure_context(device)
        self._driver, self._check = driver, check
        self._module = check(driver.cuModuleLoadData(compiled.cubin), f"loading {name}")
        self._func = check(driver.cuModuleGetFunction(self._module, name.encode()), f"finding {name}")
        if smem_limit:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(self._func, attr, smem_limit), f"raising {name}'s shared memory")

    def launch(self, grid: int, threads: int, args: tuple, types: tuple, smem: int = 0) -> None:
        d = self._driver
        stream = d.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        self._check(d.cuLaunchKernel(self._func, grid, 1, 1, threads, 1, 1, smem, stream, (args, types), 0),
                    f"launching {self.name}")


class _PeakKernel(SourceKernel):
    """A microbenchmark `name(float* out, int iters)` from `source`: PEAK_THREADS threads x
    PEAK_BLOCKS_PER_SM CTAs per SM, each thread running `iters` iterations."""

    def __init__(self, device: torch.device, source: Path, name: str):
        super().__init__(device, source, name)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.grid = sms * PEAK_BLOCKS_PER_SM
        self.out = torch.empty(self.grid * PEAK_THREADS, dtype=torch.float32, device=device)

    def warp_iterations(self, iters: int) -> int:
        return self.grid * (PEAK_THREADS // 32) * iters

    def __call__(self, iters: int) -> None:
        self.launch(self.grid, PEAK_THREADS, (self.out.data_ptr(), iters), (ctypes.c_void_p, ctypes.c_int32))

    def timed(self, target_ms: float, reps: int) -> tuple[int, list[float]]:
        """(iterations, milliseconds of `reps` launches of about target_ms each)."""
        iters = 1024
        ms = statistics.median(events_ms(lambda: self(iters), 3))
        iters = max(1024, int(iters * target_ms / max(ms, 1e-3)))
        return iters, events_ms(lambda: self(iters), reps)


def mma_rate(device: torch.device, target_ms: float = 5.0, reps: int = 10):
    """Median mma.sync bf16 -> fp32 rate in TFLOP/s, with launches of about target_ms each."""
    kernel = _PeakKernel(device, MMA_SOURCE, "mma_peak")
    iters, ms = kernel.timed(target_ms, reps)
    flops = kernel.warp_iterations(iters) * MMA_NACC * MMA_FLOPS
    return flops / (statistics.median(ms) * 1e-3) / 1e12, flops, ms, kernel.grid, kernel.arch


def cvt_rate(device: torch.device, target_ms: float = 5.0, reps: int = 10) -> float:
    """Median e4m3x2 -> f16x2 conversion rate (cvt.rn.f16x2.e4m3x2, F2FP in SASS), in lanes per
    second per SM (divide by the SM clock for lanes per cycle)."""
    kernel = _PeakKernel(device, CVT_SOURCE, "cvt_peak")
    iters, ms = kernel.timed(target_ms, reps)
    lanes = kernel.warp_iterations(iters) * 32 * CVT_CHAINS
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return lanes / (statistics.median(ms) * 1e-3) / sms


def gemm_rate(device: torch.device, n: int = 8192, reps: int = 10) -> tuple[float, int, list[float]]:
    """Median rate of an n x n x n bf16 torch.matmul (cuBLAS; fp32 accumulation) on random data,
    in TFLOP/s (zeros run faster: less switching power, higher clocks)."""
    g = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=g, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    ms = events_ms(lambda: torch.matmul(a, b, out=c), reps)
    del a, b, c
    torch.cuda.empty_cache()
    return 2 * n**3 / (statistics.median(ms) * 1e-3) / 1e12, n, ms


def measure(device: torch.device) -> Ceilings:
    copy_tbps, copy_bytes, copy_ms = copy_bandwidth(device)
    mma_tflops, mma_flops, mma_ms, grid, arch = mma_rate(device)
    gemm_tflops, gemm_n, gemm_ms = gemm_rate(device)
    return Ceilings(copy_tbps, copy_bytes, copy_ms, mma_tflops, mma_flops, mma_ms, grid, arch, gemm_tflops, gemm_n,
                    gemm_ms)
