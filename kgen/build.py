"""Build: render each planned variant, compile it for an arch through the cache, report resources."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import nvrtc
from .cache import KernelCache, cache_key
from .errors import CompileError
from .plan import Plan, Variant
from .render import headers, render


@dataclass(frozen=True)
class BuiltKernel:
    variant: Variant
    arch: str  # the arch the cubin is for (may differ from the plan's arch)
    cubin: bytes
    report: nvrtc.ResourceReport
    status: str  # "compiled" or "cached"
    seconds: float

    @property
    def smem_bytes(self) -> int:
        return self.variant.smem_bytes + self.report.static_smem

    def row(self) -> dict:
        """The row `kgen build` prints and --json emits."""
        return {
            "kernel": self.variant.name,
            "arch": self.arch,
            "variant_id": self.variant.variant_id,
            "registers": self.report.registers,
            "spill_bytes": self.report.spill_bytes,
            "smem_bytes": self.smem_bytes,
            "cubin_bytes": len(self.cubin),
            "status": self.status,
            "seconds": round(self.seconds, 3),
        }


def build_variant(variant: Variant, arch: str, cache: KernelCache) -> BuiltKernel:
    start = time.perf_counter()
    source = render(variant)
    hdrs = headers()
    key = cache_key(source=source, headers=hdrs, nvrtc_version=nvrtc.nvrtc_version(),
                    options=nvrtc.options(arch), arch=arch)

    def compile_() -> tuple[bytes, str, dict]:
        try:
            out = nvrtc.compile_cubin(source, hdrs, arch, variant.variant_id, f"{variant.name}.cu")
        except CompileError as e:
            kept = cache.root / "failed" / f"{variant.variant_id}.{arch}.cu"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(source)
            raise CompileError(f"{variant.name} for {arch}: {e}\n(rendered source kept at {kept})") from None
        r = out.report
        return out.cubin, source, {
            "variant_id": variant.variant_id, "arch": arch, "nvrtc": nvrtc.nvrtc_version(),
            "registers": r.registers, "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
            "stack_bytes": r.stack_bytes, "static_smem": r.static_smem, "log": out.log,
        }

    entry, status = cache.get_or_build(key, compile_)
    m = entry.meta
    report = nvrtc.ResourceReport(registers=m["registers"], spill_stores=m["spill_stores"],
                                  spill_loads=m["spill_loads"], stack_bytes=m["stack_bytes"],
                                  static_smem=m["static_smem"])
    return BuiltKernel(variant, arch, entry.cubin, report, status, time.perf_counter() - start)


def build(plan: Plan, archs: list[str], cache: KernelCache | None = None,
          on_done: Callable[[BuiltKernel], None] | None = None) -> list[BuiltKernel]:
    """Compile every variant of `plan` for each arch in `archs`."""
    cache = cache or KernelCache()
    built = []
    for arch in archs:
        for variant in plan.variants:
            b = build_variant(variant, arch, cache)
            built.append(b)
            if on_done:
                on_done(b)
    return built


def repo_generated_dir() -> Path:
    return Path.cwd() / "generated"
