"""The attention loop designs (see base.py). Adding a design is adding a module with a DESIGN
and listing it here, in the planner's order of preference."""

from __future__ import annotations

from ..arch import Arch
from ..errors import PlanError
from ..spec import Spec
from . import mma_sync, overlap, seesaw, wgmma
from .base import Design, Tiles, TileWork
from .mma_sync import MmaSyncTiles
from .overlap import OverlapTiles
from .seesaw import SeesawTiles
from .wgmma import WgmmaTiles

# the first that plans wins (the seesaw loop ahead of the wgmma loop: bench/NOTES.md v23); the overlap loop
# only where asked for (tiles, kgen tune): v15
DESIGNS: tuple[Design, ...] = (seesaw.DESIGN, wgmma.DESIGN, mma_sync.DESIGN, overlap.DESIGN)
_BY_NAME = {d.name: d for d in DESIGNS}


def named(name: str) -> Design:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise PlanError(f"unknown loop design {name!r}; known: {', '.join(_BY_NAME)}") from None


def of(tiles: Tiles) -> Design:
    """The design a tiling belongs to."""
    return named(tiles.design)


def allowed(arch: Arch) -> list[Design]:
    """The designs whose instructions `arch` has, in order of preference."""
    return [d for d in DESIGNS if d.allowed(arch)]


def choose(spec: Spec, arch: Arch) -> Tiles:
    """The arch's own loop: the first allowed design the planner may choose (Design.heuristic) that can
    plan the spec (wgmma where the arch has it and the spec allows it; otherwise the mma.sync loop with
    the deepest ring that fits)."""
    error = None
    for design in (d for d in allowed(arch) if d.heuristic):
        try:
            return design.choose(spec, arch)
        except PlanError as e:
            error = e
    raise error or PlanError(f"{spec.name}: no loop design runs on {arch.name}")


def text(tiles: Tiles) -> str:
    """A tiling as text: "<design>:<its fields in order>", e.g. "mma_sync:32,32,2,4,1"."""
    return of(tiles).text(tiles)


def parse(value: str) -> Tiles | None:
    """The tiling of a text, None if it is not one."""
    name, _, numbers = value.partition(":")
    design = _BY_NAME.get(name)
    try:
        nums = tuple(int(x) for x in numbers.split(","))
    except ValueError:
        return None
    return design.parse(nums) if design else None


def text_forms() -> str:
    return " or ".join(d.text_form() for d in DESIGNS)


__all__ = ["DESIGNS", "Design", "Tiles", "TileWork", "MmaSyncTiles", "OverlapTiles", "SeesawTiles", "WgmmaTiles", "named", "of", "allowed",
           "choose", "text", "parse", "text_forms"]
