"""Every KGEN_* switch, read in one place with one parser (DESIGN §7).

A flag is off when unset, empty, 0, false, no or off, and on when 1, true, yes or on (any case,
spaces ignored); any other value is an error that names the variable. Values are read when they
are asked for, so a test or a server can set them at run time.

  KGEN_CACHE_DIR             cubin cache and user tuned tables (default ~/.cache/kgen)
  KGEN_DISABLE_JIT           a cache miss is an error (serving)
  KGEN_ALWAYS_COMPILE        rebuild every kernel
  KGEN_VALIDATE              device-side index checks (debug: the op syncs)
  KGEN_DEFRAG                install SGLang's opt-in defrag hook (and its KGEN_DEFRAG_* settings)
  KGEN_DEFRAG_STAGING_BYTES  staging memory per defrag launch pair
  KGEN_SGLANG_SPEC           the spec the SGLang backend runs (default: derived from the model)
  KGEN_SGLANG_EXTEND_ATTENTION  where bench/ finds SGLang's Triton extend_attention.py
  KGEN_TEST_*                the test suite's own settings (tests/conftest.py)
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import KgenError

_OFF = ("", "0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


class EnvError(KgenError, ValueError):
    """A KGEN_* variable set to a value kgen cannot read."""


def flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise EnvError(f"{name}={os.environ[name]!r}: expected one of {'/'.join(_ON)} (on) or "
                   f"{'/'.join(v for v in _OFF if v)} (off), or unset")


def _number(name: str, default, kind):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        raise EnvError(f"{name}={value!r}: expected {'an integer' if kind is int else 'a number'}") from None


def integer(name: str, default: int) -> int:
    return _number(name, default, int)


def number(name: str, default: float) -> float:
    return _number(name, default, float)


def path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def cache_root() -> Path:
    return path("KGEN_CACHE_DIR") or Path.home() / ".cache" / "kgen"
