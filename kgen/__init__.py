"""kgen: generated CUDA kernels for MLA speculative-decoding tree verification."""

__version__ = "0.1.0"

from .spec import Spec, load_spec  # noqa: E402


def jit(spec, *, device=None, tiles=None):
    """Compile (or load cached) kernels of `spec` for the current GPU and return the op module."""
    from . import library
    from .ops import Module

    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    module = Module(spec, device=device, tiles=tiles)
    library.register(module)  # also reachable as torch.ops.kgen.*(..., spec_name=spec.name)
    return module


__all__ = ["Spec", "load_spec", "jit", "__version__"]
