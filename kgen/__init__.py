"""kgen: generated CUDA kernels for MLA speculative-decoding tree verification."""

__version__ = "0.1.0"

from .spec import Spec, load_spec  # noqa: E402


def jit(spec, *, device=None):
    """Compile (or load cached) kernels of `spec` for the current GPU and return the op module."""
    from .ops import Module

    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    return Module(spec, device=device)


__all__ = ["Spec", "load_spec", "jit", "__version__"]
