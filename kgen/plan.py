"""Plan: turn a spec into kernel variants (tiles, threads, stages, constants, signature) that fit
the target arch's limits.

The attention tiling comes from the loop designs the arch allows (kgen/designs/); every kernel
entry of the registry (kgen/kernels.py) then plans its variants from it. The planner owns the
shared-memory budget: the design's layout is the one the kernel reads (rendered into its config)
and a plan over the arch's limit is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import designs
from .arch import Arch, get_arch
from .designs import Tiles
from .errors import PlanError
from .kernels import ENTRIES
from .occupancy import ctas_by_smem, smem_per_cta
from .splitkv import Capacity, work_capacity
from .spec import Spec
from .variant import PlanContext, Variant


@dataclass(frozen=True)
class Plan:
    spec: Spec
    arch: Arch
    tiles: Tiles
    variants: tuple[Variant, ...]
    budget: dict[str, int] = field(default_factory=dict)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def capacity(self, total_tokens: int, batch: int, target_ctas: int) -> Capacity:
        """Upper bounds of the schedule's work items (the attention grids) of a batch."""
        return work_capacity(self.spec.model.num_q_heads, self.tiles.bm, total_tokens, batch, target_ctas,
                             self.tiles.cluster)


def _tag(spec: Spec, arch: Arch) -> str:
    m, c = spec.model, spec.cache
    dtype = {"bf16": "bf16", "f16": "e4m3f16", "e4m3": "e4m3"}[c.mma_type]  # KV type, and MMA type if other
    dtype += "_pb" if c.per_block else ""  # per-block scaled (DSA pool) rows
    tree = f"st{spec.tree.nodes}" if spec.tree.is_static else f"t{spec.tree.nodes}"
    return f"h{m.num_q_heads}_d{m.head_dim}_ps{c.page_size}_{dtype}_{tree}_{arch.name.replace('_', '')}"


def plan(spec: Spec, arch: str | Arch | None = None, tiles: Tiles | None = None) -> Plan:
    """Plan every kernel of `spec` for `arch` (default: the spec's target). `tiles` overrides the
    attention tiling (for tuning); it is still checked against the arch's limits."""
    arch = get_arch(arch or spec.target.arch) if not isinstance(arch, Arch) else arch
    tiles = tiles or designs.choose(spec, arch)
    design = designs.of(tiles)
    missing = [f for f in design.requires if f not in arch.features]
    if missing:
        raise PlanError(f"{spec.name}: the {design.name} loop needs {', '.join(missing)}, which {arch.name} lacks")
    ctx = PlanContext(spec, arch, tiles, _tag(spec, arch))
    smem = ctx.attention_smem
    # Over the per-block limit, the variants' own check below says by how much.
    if smem <= arch.smem_per_block and ctas_by_smem(arch, smem) < tiles.min_blocks:
        raise PlanError(f"{spec.name}: {tiles.min_blocks} attention CTAs per SM need "
                        f"{tiles.min_blocks} x {smem_per_cta(arch, smem)} B of shared memory; "
                        f"{arch.name} has {arch.smem_per_sm} B per SM")
    variants = [v for entry in ENTRIES for v in entry.variants(ctx)]
    for v in variants:
        if v.smem_bytes > arch.smem_per_block:
            raise PlanError(
                f"{spec.name}: {v.name} needs {v.smem_bytes} B of shared memory per block; "
                f"{arch.name} allows {arch.smem_per_block} B (over by {v.smem_bytes - arch.smem_per_block} B)"
            )
        warps = v.threads // 32
        if warps * v.min_blocks > arch.max_warps_per_sm:
            raise PlanError(f"{spec.name}: {v.name} wants {warps * v.min_blocks} warps per SM; "
                            f"{arch.name} has {arch.max_warps_per_sm}")

    budget = {"smem_per_block": arch.smem_per_block, "attention_smem": smem,
              "attention_smem_headroom": arch.smem_per_block - smem}
    return Plan(spec=spec, arch=arch, tiles=tiles, variants=tuple(variants), budget=budget)
