"""What each target GPU allows: the planner's budgets and the performance model's ceilings."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import KgenError


class ArchError(KgenError, KeyError):
    """An arch name or device that kgen has no table entry for."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Arch:
    name: str  # NVRTC's --gpu-architecture value, e.g. "sm_120"
    description: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block: int  # bytes a block may opt in to (dynamic + static)
    smem_per_sm: int  # bytes of shared memory per SM
    smem_reserved_per_block: int  # bytes the driver keeps per resident block
    regs_per_sm: int
    max_regs_per_thread: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    dram_gbps: float  # bytes/s / 1e9, for the performance model
    l2_mb: float  # L2 size (MB, 1e6 bytes): whether a call's partial states stay in it (kgen/model.py)
    mma_bf16_tflops: float  # dense mma.sync bf16 -> fp32 (f16 runs at the same rate)
    # Per-SM rates of the resource model (kgen/model.py); the others above are per GPU.
    clock_ghz: float  # SM clock the per-cycle rates assume
    mma_fp8_tflops: float  # dense mma.sync e4m3 -> fp32; 0: none (ptxas emulates it with f16 HMMAs)
    fp8_cvt_per_clk: float  # e4m3x2 -> f16x2 conversions (F2FP.F16.E4M3.UNPACK_B) per SM per cycle
    smem_bytes_per_clk: int = 128  # shared-memory bandwidth per SM
    wgmma_bf16_tflops: float = 0.0  # dense wgmma bf16 -> fp32; 0: no wgmma
    mma_sync_bf16: bool = True
    mma_sync_fp8: bool = False
    bulk_copy: bool = True  # cp.async.bulk and mbarrier transaction counts (sm_90+)
    ldmatrix: bool = True
    wgmma: bool = False
    # Bulk copies into every CTA of a cluster at once (.multicast::cluster): PTX has them from sm_90
    # on, but ptxas says they are fast only on the arch-specific targets it names (sm_90a, sm_100a,
    # ...; not sm_120, where it expects "substantially reduced performance"): multicast_fast.
    multicast: bool = True
    multicast_fast: bool = False

    @property
    def features(self) -> list[str]:
        names = ("mma_sync_bf16", "mma_sync_fp8", "bulk_copy", "ldmatrix", "wgmma", "multicast")
        return [n for n in names if getattr(self, n)]


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(
            name="sm_120",
            description="RTX PRO 6000 Blackwell (GB202)",
            compute_capability=(12, 0),
            sm_count=188,
            smem_per_block=99 * 1024,
            smem_per_sm=100 * 1024,
            smem_reserved_per_block=1024,
            regs_per_sm=65536,
            max_regs_per_thread=255,
            max_warps_per_sm=48,
            max_blocks_per_sm=32,
            dram_gbps=1792.0,
            l2_mb=128.0,  # DESIGN §2
            mma_bf16_tflops=504.0,
            clock_ghz=2.617,  # boost clock: 504 TFLOP/s = 188 SMs x 1024 FLOP/cycle at 2.617 GHz (an assumption)
            mma_fp8_tflops=1008.0,  # 2x bf16 (DESIGN §2)
            fp8_cvt_per_clk=64.0,  # assumed: 16 per sub-partition, as other conversions to 16-bit types
            mma_sync_fp8=True,
        ),
        Arch(
            name="sm_90",
            description="H100/H200 (Hopper)",
            compute_capability=(9, 0),
            sm_count=132,
            smem_per_block=227 * 1024,
            smem_per_sm=228 * 1024,
            smem_reserved_per_block=1024,
            regs_per_sm=65536,
            max_regs_per_thread=255,
            max_warps_per_sm=64,
            max_blocks_per_sm=32,
            dram_gbps=4180.0,  # measured copy bandwidth on the H200 (DESIGN §2)
            l2_mb=50.0,  # the H100's (the H200's is 50-60 MB: DESIGN §2)
            mma_bf16_tflops=630.0,  # measured mma.sync rate on the H200 (DESIGN §2)
            clock_ghz=1.755,  # measured by ncu under verify_attn (bench/NOTES.md)
            mma_fp8_tflops=0.0,  # no e4m3 mma.sync: 2 f16 HMMAs + operand unpacks each (bench/NOTES.md v6)
            fp8_cvt_per_clk=64.0,  # assumed (the fit of bench/model_table.py); bench.model_validate measures it
            mma_sync_fp8=True,
            wgmma=True,
            multicast_fast=True,  # on sm_90a
            wgmma_bf16_tflops=775.0,  # a large cuBLAS GEMM (wgmma) on the H200, measured (DESIGN §9)
        ),
    )
}


@dataclass(frozen=True)
class Target:
    """What a module is for, resolved once: the arch whose plan it runs (budgets, loop designs),
    the arch its cubins are compiled for (the GPU present), and that GPU's SM count (the grids).
    The sm_120 plan runs on an H200 as Target(plan_arch=sm_120, cubin_arch=sm_90, sm_count=132)."""

    plan_arch: Arch
    cubin_arch: Arch
    sm_count: int


def nvrtc_arch(arch: str, requires: tuple[str, ...] = ()) -> str:
    """NVRTC's --gpu-architecture for code compiled for `arch` that uses the features `requires`:
    wgmma and setmaxnreg exist only in the arch-specific sm_90a target, and multicast copies are
    fast only there."""
    a = get_arch(arch)
    missing = [f for f in requires if f not in a.features]
    if missing:
        raise ArchError(f"{arch} lacks {', '.join(missing)}: a kernel that uses it cannot be built for {arch}")
    return f"{arch}a" if "wgmma" in requires or ("multicast" in requires and a.multicast_fast) else arch


def get_arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ArchError(f"unknown arch {name!r}; known: {', '.join(sorted(ARCHS))}") from None


def arch_for_capability(major: int, minor: int) -> Arch:
    """The arch whose code runs on a device of this compute capability."""
    for arch in ARCHS.values():
        if arch.compute_capability == (major, minor):
            return arch
    raise ArchError(f"no kgen arch for compute capability {major}.{minor}; known: {', '.join(sorted(ARCHS))}")
