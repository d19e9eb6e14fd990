"""Theoretical occupancy: how many CTAs of a kernel fit on one SM of an arch, and what limits it.

The same arithmetic as CUDA's occupancy calculator (cuda_occupancy.h): registers are allocated per
warp in units of 256 (a thread's count rounded up to 8) within one of the SM's 4 sub-partitions
(a quarter of the register file each, whole warps), and a launch is checked as if a CTA's warps
were rounded up to a multiple of 4; shared memory per CTA is dynamic + static + the driver's
per-block reservation, in 128-byte units, against the SM's shared memory; warps and CTAs per SM
are capped by the arch. (So two CTAs of 5 warps keep at most 168 registers a thread, not 200: what
ptxas caps __launch_bounds__(160, 2) at.)
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import Arch, get_arch

REG_UNIT_PER_THREAD = 8  # 8 registers per thread = 256 per warp
SUB_PARTITIONS = 4  # an SM's register file is split among its 4 schedulers' sub-partitions
SMEM_UNIT = 128
MAX_THREADS_PER_BLOCK = 1024


@dataclass(frozen=True)
class Occupancy:
    ctas_per_sm: int
    warps_per_sm: int
    limit: str  # the resource that caps ctas_per_sm ("registers", "smem", "warps", "blocks"; ties joined by "+")
    by_resource: dict[str, int]  # CTAs/SM each resource alone allows

    def row(self) -> dict:
        return {"ctas_per_sm": self.ctas_per_sm, "warps_per_sm": self.warps_per_sm}


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def smem_per_cta(arch: Arch, smem_bytes: int) -> int:
    """Shared memory an SM gives a CTA of `smem_bytes` (dynamic + static): with the driver's
    per-block reservation, in SMEM_UNIT units."""
    return _round_up(smem_bytes + arch.smem_reserved_per_block, SMEM_UNIT)


def ctas_by_smem(arch: Arch, smem_bytes: int) -> int:
    """CTAs per SM that `smem_bytes` of shared memory a CTA allow; 0 over the per-block limit."""
    if smem_bytes > arch.smem_per_block:
        return 0
    return arch.smem_per_sm // smem_per_cta(arch, smem_bytes)


def occupancy(arch: Arch | str, threads: int, registers: int, smem_bytes: int) -> Occupancy:
    """CTAs per SM of a kernel with `threads` per block, `registers` per thread and `smem_bytes`
    (dynamic + static) of shared memory per block."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    warps = -(-threads // 32)
    regs_per_warp = _round_up(max(registers, 1), REG_UNIT_PER_THREAD) * 32
    # the launch check counts a CTA's warps in whole sub-partition rounds; then each sub-partition holds
    # the warps its quarter of the register file fits
    fits_launch = (registers <= arch.max_regs_per_thread
                   and regs_per_warp * _round_up(warps, SUB_PARTITIONS) <= arch.regs_per_sm)
    warps_by_regs = (arch.regs_per_sm // SUB_PARTITIONS // regs_per_warp) * SUB_PARTITIONS
    by = {
        "registers": warps_by_regs // warps if fits_launch else 0,
        "smem": ctas_by_smem(arch, smem_bytes),
        "warps": arch.max_warps_per_sm // warps if threads <= MAX_THREADS_PER_BLOCK else 0,
        "blocks": arch.max_blocks_per_sm,
    }
    ctas = min(by.values())
    limit = "+".join(k for k, n in by.items() if n == ctas)
    return Occupancy(ctas_per_sm=ctas, warps_per_sm=ctas * warps, limit=limit, by_resource=by)
