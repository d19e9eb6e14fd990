"""Build: render each planned variant, compile it for an arch through the cache, report resources."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from . import nvrtc, sass
from .cache import Entry, KernelCache, cache_key
from .arch import nvrtc_arch
from .errors import CacheMissError, CompileError
from .occupancy import Occupancy, occupancy
from .plan import Plan
from .render import included_headers, render
from .variant import Variant


@dataclass(frozen=True)
class BuiltKernel:
    variant: Variant
    arch: str  # the arch the cubin is for (may differ from the plan's arch)
    cubin: bytes
    report: nvrtc.ResourceReport
    status: str  # "compiled" or "cached"
    seconds: float
    sass: dict[str, int] | None = None  # instruction-class counts (sass.counts), when inspected
    key: str = ""  # its cache entry's key (KernelCache.entry_dir); empty for a cubin built outside the cache

    @property
    def smem_bytes(self) -> int:
        return self.variant.smem_bytes + self.report.static_smem

    @property
    def occupancy(self) -> Occupancy:
        return occupancy(self.arch, self.variant.threads, self.report.registers, self.smem_bytes)

    def problems(self) -> list[str]:
        """Where the cubin falls short of its plan: spills, warpgroup MMAs ptxas serialized, local
        memory, occupancy below the plan's min_blocks, and instruction classes its design needs
        (variant.sass_expect) missing."""
        out = []
        if self.report.spill_bytes:
            out.append(f"{self.report.spill_bytes} bytes of register spills")
        if self.report.wgmma_serialized:
            out.append(f"ptxas serializes its warpgroup MMAs ({self.report.wgmma_serialized})")
        occ = self.occupancy
        if occ.ctas_per_sm < self.variant.min_blocks:
            out.append(f"{occ.ctas_per_sm} CTAs/SM (limited by {occ.limit}) < the plan's {self.variant.min_blocks}")
        if self.sass is None:
            return out
        if sass.local_memory_count(self.sass):
            out.append(f"local memory traffic: {self.sass['LDL']} LDL, {self.sass['STL']} STL")
        for cls in self.variant.sass_expect:  # what the design's loop must compile to
            n = sass.mma_count(self.sass) if cls == "MMA" else self.sass.get(cls, 0)
            if not n:
                out.append(f"no {sass.EXPECT_NAMES.get(cls, cls)} in the SASS")
        return out

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
            "sass": self.sass,
            "occupancy": self.occupancy.row(),
            "limit": self.occupancy.limit,
            "status": self.status,
            "seconds": round(self.seconds, 3),
        }


def sass_counts(cache: KernelCache, entry: Entry) -> dict[str, int]:
    """The entry's SASS counts: from its meta, or disassembled once and added to the meta."""
    cached = entry.meta.get("sass")
    if isinstance(cached, dict) and cached.get("version") == sass.COUNTS_VERSION:
        return sass.ordered(cached["counts"])
    counts = sass.counts(entry.cubin)
    cache.update_meta(entry, {"sass": {"version": sass.COUNTS_VERSION, "counts": counts}})
    return counts


def build_variant(variant: Variant, arch: str, cache: KernelCache, inspect: bool = False) -> BuiltKernel:
    """Compile (or load) one variant for `arch`; `inspect` also counts its SASS."""
    start = time.perf_counter()
    source = render(variant)
    hdrs = included_headers(source)
    target = nvrtc_arch(arch, variant.requires)
    key = cache_key(source=source, headers=hdrs, nvrtc_version=nvrtc.nvrtc_version(),
                    options=nvrtc.options(target), arch=target)

    def compile_() -> tuple[bytes, str, dict]:
        try:
            out = nvrtc.compile_cubin(source, hdrs, target, variant.variant_id, f"{variant.name}.cu")
        except CompileError as e:
            kept = cache.root / "failed" / f"{variant.variant_id}.{arch}.cu"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(source)
            raise CompileError(f"{variant.name} for {arch}: {e}\n(rendered source kept at {kept})") from None
        # the log is the resource report's one source: parsed again on every load (below)
        return out.cubin, source, {"variant_id": variant.variant_id, "arch": arch, "nvrtc": nvrtc.nvrtc_version(),
                                   "log": out.log}

    try:
        entry, status = cache.get_or_build(key, compile_)
    except CacheMissError as e:  # name the kernel, not its hash
        raise CacheMissError(f"kernel {variant.name} ({variant.tag}) for {arch} is {e}; build it first "
                             f"(kgen build SPEC --arch {arch}, same KGEN_CACHE_DIR) or unset KGEN_DISABLE_JIT") from None
    report = nvrtc.parse_report(entry.meta["log"], variant.variant_id)
    counts = sass_counts(cache, entry) if inspect else None
    return BuiltKernel(variant, arch, entry.cubin, report, status, time.perf_counter() - start, counts, key)


def build(plan: Plan, archs: list[str], cache: KernelCache | None = None,
          on_done: Callable[[BuiltKernel], None] | None = None, inspect: bool = False) -> list[BuiltKernel]:
    """Compile every variant of `plan` for each arch in `archs`; `inspect` also counts SASS
    (nvdisasm, cached in the entry's meta) — `kgen build` does, kgen.jit does not."""
    cache = cache or KernelCache()
    built = []
    for arch in archs:
        for variant in plan.variants:
            try:
                b = build_variant(variant, arch, cache, inspect)
            except CacheMissError as e:
                raise CacheMissError(f"spec {plan.spec.name}: {e}") from None
            built.append(b)
            if on_done:
                on_done(b)
    return built
