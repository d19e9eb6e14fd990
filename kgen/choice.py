"""Which tiling a batch runs: its shape bucket's choice in a tuned table (kgen/tuning.py), else
the plan's heuristic tiling, as its design fits it to the batch (Design.for_batch: e.g. the mma.sync
loop in clusters where the GPU present multicasts fast). A module holds one PlanChoice; each
prepared step asks it once."""

from __future__ import annotations

from dataclasses import dataclass

from . import designs
from .arch import Arch
from .designs import Tiles
from .spec import Spec
from .tuning import Bucket, Table, find_table


@dataclass(frozen=True)
class PlanChoice:
    default: Tiles  # the heuristic tiling (or the one a caller forced)
    table: Table | None = None
    cubin_arch: Arch | None = None  # the GPU present, where the heuristic tiling is fitted to batches; None: never

    @classmethod
    def find(cls, spec: Spec, plan_arch: Arch, tiles: Tiles | None = None, cubin_arch: Arch | None = None
             ) -> PlanChoice:
        """`tiles` forced (tuning: no table, no fitting), else the heuristic tiling, fitted to each
        batch on `cubin_arch`, and the matching tuned table."""
        if tiles is not None:
            return cls(tiles)
        return cls(designs.choose(spec, plan_arch), find_table(spec, plan_arch.name), cubin_arch)

    def tilings(self) -> list[Tiles]:
        """Every tiling a batch may run: the default first, its fits to batches, then the table's, each once."""
        fitted = designs.of(self.default).batch_fits(self.default, self.cubin_arch) if self.cubin_arch else []
        chosen = [c.tiles for c in self.table.choices.values()] if self.table else []
        return list(dict.fromkeys([self.default, *fitted, *chosen]))

    def tiles_for(self, num_tokens: int, batch: int, context_tokens: int, heads: int) -> Tiles:
        """The tiling of a batch: `context_tokens` is its prefix capacity (kv_indices pages x page size)."""
        tuned = self.table.tiles_for(Bucket.of(num_tokens, batch, context_tokens)) if self.table else None
        if tuned or not self.cubin_arch:
            return tuned or self.default
        return designs.of(self.default).for_batch(self.default, self.cubin_arch, num_tokens * heads / max(batch, 1))
