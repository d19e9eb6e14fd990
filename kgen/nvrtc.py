"""Compile CUDA source to a cubin with NVRTC from pip (cuda-python), and read ptxas's report.

No system CUDA toolkit is needed: NVRTC and the CUDA headers (cuda_bf16.h) come from the
nvidia-cuda-nvrtc / nvidia-cuda-runtime wheels, located with cuda.pathfinder.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from .errors import CompileError


@dataclass(frozen=True)
class ResourceReport:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int
    # ptxas's advisory that it serialized the function's warpgroup MMAs (each waits for the last: an
    # sm_90 loop's overlap gone), and why; "" when it did not
    wgmma_serialized: str = ""

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str
    report: ResourceReport


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _check(result, what: str, log: str = "") -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(result)
        raise CompileError(f"NVRTC {what} failed: {msg.decode()}" + (f"\n{log}" if log else ""))


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    err, major, minor = _nvrtc().nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


@lru_cache(maxsize=1)
def cuda_include_dir() -> str:
    from cuda import pathfinder

    found = pathfinder.find_nvidia_header_directory("cudart")
    if not found:
        raise CompileError("CUDA runtime headers not found: pip install nvidia-cuda-runtime")
    return str(found)


def options(arch: str) -> list[str]:
    """NVRTC options; part of the cache key."""
    return [
        f"--gpu-architecture={arch}",
        "--std=c++17",
        "--ptxas-options=--verbose",
        # ptxas's report is how kgen sees registers and spills, but a cubin NVRTC serves from the
        # driver's compute cache (~/.nv) comes without one; kgen keeps its own cache.
        "--no-cache",
        "--generate-line-info",
        "--device-as-default-execution-space",
    ]


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized due to (.+?) (?:in|for) the function '([^']+)'")


def parse_report(log: str, symbol: str) -> ResourceReport:
    """ptxas's verbose lines for one entry function."""
    section = log.split(f"Compiling entry function '{symbol}'", 1)
    if len(section) != 2:
        raise CompileError(f"no ptxas report for {symbol} in NVRTC's log:\n{log}")
    body = section[1].split("Compiling entry function", 1)[0]
    regs = _REGS.search(body)
    # the entry's line first, then one per out-of-line (__noinline__) function it calls: their spills count too
    spills = [tuple(map(int, m.groups())) for m in _SPILL.finditer(body)]
    smem = _SMEM.search(body)
    if not (regs and spills):
        raise CompileError(f"cannot parse ptxas report for {symbol}:\n{body}")
    return ResourceReport(
        registers=int(regs.group(1)),
        stack_bytes=spills[0][0],
        spill_stores=sum(s[1] for s in spills),
        spill_loads=sum(s[2] for s in spills),
        static_smem=int(smem.group(1)) if smem else 0,
        wgmma_serialized=wgmma_serialized(log, symbol),
    )


def wgmma_serialized(log: str, symbol: str) -> str:
    """Why ptxas serialized `symbol`'s warpgroup MMAs (its advisory lines come before the function's
    report, so the whole log is searched), or "" when it did not."""
    return "; ".join(m.group(1) for m in _SERIALIZED.finditer(log) if m.group(2) == symbol)


def _compile(source: str, headers: dict[str, str], arch: str, filename: str,
             extra_options: Sequence[str]) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    names = list(headers)
    err, prog = nvrtc.nvrtcCreateProgram(
        source.encode(), filename.encode(), len(names),
        [headers[n].encode() for n in names], [n.encode() for n in names],
    )
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in [*options(arch), *extra_options, f"--include-path={cuda_include_dir()}"]]
        (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "nvrtcGetProgramLogSize")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
        _check(err, "nvrtcGetProgramLog")
        log = buf.rstrip(b"\x00 ").decode(errors="replace")
        _check(compile_err, f"compiling {filename} for {arch}", log)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, log


def compile_cubin(source: str, headers: dict[str, str], arch: str, symbol: str, filename: str,
                  extra_options: Sequence[str] = ()) -> Compiled:
    """Compile `source` for `arch`; a failure raises CompileError carrying NVRTC's log.
    `extra_options` are appended to options(arch) (tests use them to force a register cap)."""
    cubin, log = _compile(source, headers, arch, filename, extra_options)
    return Compiled(cubin=cubin, log=log, report=parse_report(log, symbol))
