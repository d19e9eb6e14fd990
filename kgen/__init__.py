"""kgen: generated CUDA kernels for MLA speculative-decoding tree verification."""

import sys

from .spec import Spec, load_spec
from .version import __version__

if "torch" in sys.modules:  # a torch user: define torch.ops.kgen.* now (the CLI, which needs no torch, stays fast)
    from . import library  # noqa: F401


def jit(spec, *, device=None, tiles=None, arch=None):
    """Compile (or load cached) kernels of `spec` for the current GPU and return the op module.

    The plan is the GPU's own (sm_90 on an H100/H200: the wgmma loop) unless `arch` names another
    arch whose plan the GPU can run (arch="sm_120" runs the sm_120 plan on an H200, for testing);
    `tiles` overrides the plan's attention tiling (tuning)."""
    from . import library
    from .ops import Module

    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    module = Module(spec, device=device, tiles=tiles, arch=arch)
    library.register(module)  # also reachable as torch.ops.kgen.*(..., spec_name=spec.name)
    return module


__all__ = ["Spec", "load_spec", "jit", "__version__"]
