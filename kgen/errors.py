"""Errors a user can act on. The CLI prints these as one line, without a traceback."""


class KgenError(Exception):
    """Base class for every error kgen raises on purpose."""


class SpecError(KgenError, ValueError):
    """A spec file is missing, unreadable or invalid."""


class PlanError(KgenError, ValueError):
    """A spec cannot be planned within the target arch's limits."""


class CompileError(KgenError, RuntimeError):
    """NVRTC rejected a rendered kernel."""


class CacheMissError(KgenError, RuntimeError):
    """KGEN_DISABLE_JIT=1 and a kernel is not in the cache."""


class CudaError(KgenError, RuntimeError):
    """A CUDA driver call failed."""


class CacheError(KgenError, OSError):
    """The kernel cache directory cannot be used (not a directory, not writable)."""


class CacheWarning(UserWarning):
    """Something in the kernel cache was repaired (a damaged entry removed and rebuilt)."""
