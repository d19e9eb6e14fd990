"""Load cubins through the CUDA driver API (cuda-python) and launch them on torch's stream."""

from __future__ import annotations

import torch

from .build import BuiltKernel
from .errors import CudaError
from .signature import pack


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


class Kernel:
    """One loaded entry point. The dynamic shared-memory limit is raised once, here."""

    def __init__(self, built: BuiltKernel, device: torch.device):
        driver = _driver()
        ensure_context(device)
        self.variant = built.variant
        self.device = device
        self._module = check(driver.cuModuleLoadData(built.cubin), f"loading {self.variant.variant_id}")
        self._func = check(driver.cuModuleGetFunction(self._module, self.variant.variant_id.encode()),
                           f"finding {self.variant.variant_id}")
        if self.variant.smem_bytes > 48 * 1024:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(self._func, attr, self.variant.smem_bytes),
                  f"raising shared memory of {self.variant.name} to {self.variant.smem_bytes} B")

    def __call__(self, grid: int | tuple[int, ...], **args) -> None:
        """Launch on the current torch stream with arguments named as in the C signature."""
        gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else (*grid, *(1,) * (3 - len(grid)))
        if gx <= 0 or gy <= 0 or gz <= 0:
            return
        values, types = pack(self.variant.params, args)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        check(_driver().cuLaunchKernel(self._func, gx, gy, gz, self.variant.threads, 1, 1,
                                       self.variant.smem_bytes, _driver().CUstream(stream), (values, types), 0),
              f"launching {self.variant.name}")
