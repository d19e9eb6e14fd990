"""Load cubins through the CUDA driver API (cuda-python) and launch them on torch's stream."""

from __future__ import annotations

from typing import Callable

import torch

from .build import BuiltKernel
from .errors import CudaError
from .signature import ParamBlock, ParamLayout
from .variant import Variant


def _driver():
    from cuda.bindings import driver

    return driver


def check(result, what: str):
    """Unwrap a cuda-python (err, *values) result, raising CudaError on failure."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, desc = driver.cuGetErrorString(err)
        raise CudaError(f"{what} failed: {name.decode() if name else err} ({desc.decode() if desc else ''})")
    return values[0] if len(values) == 1 else tuple(values)


def ensure_context(device: torch.device) -> None:
    """Make torch's primary context of `device` current on this thread for driver calls."""
    driver = _driver()
    torch.cuda.init()
    with torch.cuda.device(device):
        torch.cuda.current_stream(device)  # makes torch create and bind its context
        check(driver.cuInit(0), "cuInit")
        ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) == 0:
            dev = check(driver.cuDeviceGet(device.index or 0), "cuDeviceGet")
            ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


_CONFIGS_KEPT = 64  # launch configs a kernel keeps (grid, threads, stream); a server's steps reuse a few


class Kernel:
    """One loaded entry point: its variant, its CUfunction and the launch calls (cuLaunchKernel;
    cuLaunchKernelEx for a variant that waits_for_prior). Kernel.load loads a built cubin; the
    constructor takes what was loaded (or stand-ins, on a machine without a GPU)."""

    def __init__(self, variant: Variant, func, stream: Callable[[], object], launch: Callable,
                 launch_ex: Callable | None = None):
        self.variant, self._func, self.stream, self._launch, self._launch_ex = variant, func, stream, launch, launch_ex
        self._threads, self._smem = variant.threads, variant.smem_bytes
        self.layout = ParamLayout(variant.params)
        self._configs: dict[tuple, object] = {}  # (grid, threads, stream handle) -> CUlaunchConfig

    @classmethod
    def load(cls, built: BuiltKernel, device: torch.device) -> Kernel:
        """Load the cubin on `device`; the dynamic shared-memory limit is raised once, here."""
        driver = _driver()
        ensure_context(device)
        v = built.variant
        module = check(driver.cuModuleLoadData(built.cubin), f"loading {v.variant_id}")
        func = check(driver.cuModuleGetFunction(module, v.variant_id.encode()), f"finding {v.variant_id}")
        if v.smem_bytes > 48 * 1024:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(func, attr, v.smem_bytes),
                  f"raising shared memory of {v.name} to {v.smem_bytes} B")
        kernel = cls(v, func, current_stream(device), driver.cuLaunchKernel, driver.cuLaunchKernelEx)
        kernel._module = module  # the CUmodule stays loaded while the kernel lives
        return kernel

    def launch(self, grid: int, params: ParamBlock, stream, threads: int | None = None) -> None:
        """Launch `grid` CTAs (of `threads`, default and at most the variant's) with a packed
        parameter block on `stream` (a CUstream). cuda-python takes an int kernelParams as a ready
        void** and converts nothing (its _HelperKernelParams). A variant that waits_for_prior is
        launched with programmatic stream serialization: it may start before the previous kernel on
        the stream has ended (its wait_for_prior_grid holds it until then)."""
        threads = threads or self._threads
        if self.variant.waits_for_prior:
            err, = self._launch_ex(self._config(grid, threads, stream), self._func, params.address, 0)
        else:
            err, = self._launch(self._func, grid, 1, 1, threads, 1, 1, self._smem, stream, params.address, 0)
        if err:
            check(err, f"launching {self.variant.name}")

    def _config(self, grid: int, threads: int, stream):
        """The CUlaunchConfig of a programmatic launch, made once per (grid, threads, stream): a new
        one costs ~1.6 us of Python, and one is never changed once made (threads may share it)."""
        key = (grid, threads, int(stream))
        config = self._configs.get(key)
        if config is None:
            if len(self._configs) >= _CONFIGS_KEPT:
                self._configs.clear()
            config = self._configs[key] = programmatic_config(grid, threads, self._smem, stream)
        return config

    def __call__(self, grid: int, **args) -> None:
        """A one-off launch on the current torch stream, arguments named as in the C signature."""
        if grid > 0:
            self.launch(grid, self.layout.pack(**args), self.stream())


def programmatic_config(grid: int, threads: int, smem: int, stream):
    """A launch config of `grid` x `threads` on `stream` whose kernel may overlap the previous one
    (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; kept as a programmatic edge in a
    captured CUDA graph)."""
    driver = _driver()
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes, config.hStream = smem, stream
    config.attrs, config.numAttrs = [attr], 1
    return config


def current_stream(device: torch.device) -> Callable[[], object]:
    """A function that returns torch's current stream on `device` as a CUstream. It reads the raw
    handle (as torch's own generated launchers do): no torch.cuda.Stream object per launch."""
    raw, index, wrap = torch._C._cuda_getCurrentRawStream, device.index, _driver().CUstream
    return lambda: wrap(raw(index))
