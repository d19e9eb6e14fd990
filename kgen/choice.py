"""Which tiling a batch runs: its shape bucket's choice in a tuned table (kgen/tuning.py), else
the plan's heuristic tiling. A module holds one PlanChoice; each prepared step asks it once."""

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

    @classmethod
    def find(cls, spec: Spec, plan_arch: Arch, tiles: Tiles | None = None) -> PlanChoice:
        """`tiles` forced (tuning: no table), else the heuristic tiling and the matching tuned table."""
        if tiles is not None:
            return cls(tiles)
        return cls(designs.choose(spec, plan_arch), find_table(spec, plan_arch.name))

    def tilings(self) -> list[Tiles]:
        """Every tiling a batch may run: the default first, then the table's, each once."""
        chosen = [c.tiles for c in self.table.choices.values()] if self.table else []
        return list(dict.fromkeys([self.default, *chosen]))

    def tiles_for(self, num_tokens: int, batch: int, context_tokens: int) -> Tiles:
        """The tiling of a batch: `context_tokens` is its prefix capacity (kv_indices pages x page size)."""
        tuned = self.table.tiles_for(Bucket.of(num_tokens, batch, context_tokens)) if self.table else None
        return tuned or self.default
