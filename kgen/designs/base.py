"""What a loop design is: one way the attention kernels (prefix_attn, verify_attn, tree_attn)
walk their KV tiles, with its own C++ header, tiles, shared-memory layout and budgets.

A design is one module of this package with one `Design` object; the planner asks the designs
an arch allows, in the order of designs.DESIGNS, for a tiling of a spec (the first that plans
wins). Each tiling is a frozen dataclass (hashable: plans and kernels are keyed by it) whose
fields, in order, are its text form ("mma_sync:32,32,2,4,1", what tuned tables hold); fields
after min_blocks are left out of it at their defaults ("mma_sync:32,32,2,2,1,4" is the loop of
"mma_sync:32,32,2,2,1" in clusters of 4 CTAs).
The performance model (kgen/model.py) asks a design for its TileWork: what one CTA does per KV
tile, counted from the SASS of the kernel's tile loop; a design may have no model entry yet.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import MISSING, astuple, dataclass, fields
from typing import ClassVar, Protocol

from ..arch import Arch
from ..errors import PlanError
from ..spec import Spec


@dataclass(frozen=True)
class TileBox:
    """How a design stages a KV tile of consecutive slots with tensor copies (kgen/tilemap.py makes
    the cache's map): `rows` rows a copy (a CTA's slice of the tile), each `box_bytes` of the row
    from its start — a staged row, its padding past the cache row landing as zeros, or the part of
    an fp8 row a converting producer reads (raw bytes) — or, swizzled
    (`swizzle128`), one 128-byte column block a copy, in the 128-byte swizzle wgmma reads."""

    rows: int
    box_bytes: int
    swizzle128: bool = False


class Tiles(Protocol):
    """A design's tiling: what every design's tiles dataclass provides."""

    design: ClassVar[str]  # the Design's name
    bm: int  # packed (token, head) rows per CTA
    bn: int  # KV rows per tile
    stages: int  # depth of the KV ring
    min_blocks: int  # CTAs per SM the plan is built for (__launch_bounds__ minimum)
    cluster: int  # CTAs a cluster (the row tiles of a split that share its KV tiles); 1: no clusters

    @property
    def threads(self) -> int: ...

    def layout(self, spec: Spec) -> dict[str, int]: ...

    def smem_bytes(self, spec: Spec) -> int: ...

    def config(self, spec: Spec) -> str: ...

    def describe(self) -> str: ...


class Design:
    """One loop design. Subclasses set the class attributes and choose/candidates/tile_work."""

    name: ClassVar[str]  # as in tiles text and manifests: "mma_sync"
    header: ClassVar[str]  # templates/<header>: its Config and attend()
    tiles: ClassVar[type]  # its tiles dataclass
    requires: ClassVar[tuple[str, ...]] = ()  # arch features beyond mma.sync, ldmatrix and bulk copies
    sass_expect: ClassVar[tuple[str, ...]] = ()  # instruction classes (kgen.sass) its compiled loop contains
    modeled: ClassVar[bool] = False  # whether tile_work gives the performance model's entry
    heuristic: ClassVar[bool] = True  # whether the planner may choose it (else tiles overrides and tune only)
    modeled_kernel: ClassVar[str] = "prefix_attn"  # the variant whose tile loop the model reads
    # tiles its consumers take together, releasing their stages at the group's end (the ring's bound on
    # a tile: kgen/model.py ring_bound_us)
    stage_group: ClassVar[int] = 1

    def allowed(self, arch: Arch) -> bool:
        return all(f in arch.features for f in self.requires)

    def choose(self, spec: Spec, arch: Arch) -> Tiles:
        """The design's heuristic tiling of `spec` on `arch`; PlanError says why there is none."""
        raise NotImplementedError

    def candidates(self, spec: Spec, arch: Arch) -> list[Tiles]:
        """Tilings `kgen tune` tries (the planner still checks each against the arch)."""
        raise NotImplementedError

    def tile_work(self, spec: Spec, tiles: Tiles, loop: Counter) -> TileWork | None:
        """The model's TileWork from the SASS opcodes of the tile loop; None: not modeled yet."""
        return None

    def tile_box(self, spec: Spec, tiles: Tiles) -> TileBox | None:
        """How the design's producer stages a KV tile of consecutive slots (pages of whole tiles) with
        tensor copies over a map of the cache (kgen/tilemap.py, made per layer by the host); None: it
        copies row by row only."""
        return None

    def batch_fits(self, tiles: Tiles, cubin_arch: Arch) -> list[Tiles]:
        """The tilings for_batch may turn the heuristic `tiles` into on `cubin_arch` (loaded with it)."""
        return []

    def for_batch(self, tiles: Tiles, cubin_arch: Arch, rows_per_request: float) -> Tiles:
        """The heuristic `tiles` fitted to a batch of `rows_per_request` packed (token, head) rows a
        request on the GPU `cubin_arch` (no tuned table has the batch's bucket)."""
        return tiles

    def text(self, tiles: Tiles) -> str:
        values, names = list(astuple(tiles)), [f.name for f in fields(self.tiles)]
        while len(values) > _text_fields(self.tiles) and values[-1] == _default(self.tiles, names[len(values) - 1]):
            values.pop()  # fields after min_blocks are left out at their defaults
        return f"{self.name}:" + ",".join(str(v) for v in values)

    def text_form(self) -> str:
        """How the text of a tiling reads: "mma_sync:BM,BN,WARPS_M,STAGES,MIN_BLOCKS[,CLUSTER]"."""
        names = [f.name.upper() for f in fields(self.tiles)]
        n = _text_fields(self.tiles)
        return f"{self.name}:" + ",".join(names[:n]) + "".join(f"[,{o}]" for o in names[n:])

    def parse(self, values: tuple[int, ...]) -> Tiles | None:
        """The tiling of a text's numbers, None if they do not fit the form."""
        return self.tiles(*values) if _text_fields(self.tiles) <= len(values) <= len(fields(self.tiles)) else None


def _text_fields(tiles: type) -> int:
    """Fields every text of a tiling has: those up to min_blocks."""
    return [f.name for f in fields(tiles)].index("min_blocks") + 1


def _default(tiles: type, name: str) -> object:
    return next(f.default for f in fields(tiles) if f.name == name)


def render_config(what: str, layout: dict[str, int], config: str) -> str:
    """C++ for a kernel source: the design's shared-memory layout as a struct of constants (the
    one source the planner's budget and the kernel both use) and `Cfg`, its config type."""
    members = "".join(f"    static constexpr int {name} = {value};\n" for name, value in layout.items())
    return f"// Shared memory of {what}: offsets and sizes in bytes.\nstruct Layout {{\n{members}}};\nusing Cfg = {config};"


def fitting(spec: Spec, arch: Arch, tiles: Tiles, loop: str) -> Tiles:
    """`tiles` where its shared memory fits a block of `arch`, else PlanError naming the loop."""
    need = tiles.smem_bytes(spec)
    if need > arch.smem_per_block:
        raise PlanError(f"{spec.name}: the {loop} loop needs {need} B of shared memory per block; "
                        f"{arch.name} allows {arch.smem_per_block} B")
    return tiles


def check(condition: bool, message: str) -> None:
    """A tiling's shape rule: PlanError(message) where it does not hold."""
    if not condition:
        raise PlanError(message)


@dataclass(frozen=True)
class TileWork:
    """What one CTA does per KV tile (the performance model's unit)."""

    mma_flops: dict[str, float]  # by MMA input type: bf16, f16, e4m3
    smem_wavefronts: float  # 128-byte shared-memory wavefronts, bulk-copy writes included
    convert_lanes: float  # fp8 -> f16 conversion lanes
    issue: float  # instructions of the busiest SM sub-partition
    barriers: int  # barriers a warp waits on
    kv_bytes: int  # KV bytes staged
    keys: int  # keys per tile (BN)


def _mma(op: str) -> tuple[str, int] | None:
    """(input type, FLOPs) of an MMA opcode: HMMA.16816.F32.BF16 -> ("bf16", 4096); a warpgroup MMA
    (one instruction per warp of the warpgroup) HGMMA.64x32x16.F32.BF16 -> ("wgmma_bf16", 65536)."""
    base, *mods = op.split(".")
    if not base.endswith("MMA"):
        return None
    shape = mods[0]  # m n k, e.g. 16816, 16832, 64x32x16
    if base == "HGMMA":
        m, n, k = (int(x) for x in shape.split("x"))
        return "wgmma_bf16", 2 * m * n * k
    flops = 2 * int(shape[:2]) * int(shape[2]) * int(shape[3:])
    kind = "e4m3" if "E4M3" in mods else "bf16" if "BF16" in mods else "f16"
    return kind, flops


def _wavefronts(op: str) -> int:
    """128-byte shared-memory wavefronts of one warp's instruction (no bank conflicts)."""
    base, *mods = op.split(".")
    if base == "LDSM":
        return int(mods[-1]) if mods[-1] in ("2", "4") else 1  # .x1/.x2/.x4 matrices of 128 bytes
    if base in ("LDS", "STS"):
        return {"128": 4, "64": 2}.get(mods[-1] if mods else "", 1)
    return 0


def tile_work_from_loop(loop: Counter, warps: int, keys: int, kv_bytes: int) -> TileWork:
    """TileWork of a loop body (one tile per iteration) that `warps` compute warps run, for a
    design whose MMAs read registers (mma.sync): shared-memory reads are its ldmatrix/lds. A design
    whose MMAs read shared memory themselves (wgmma) must add those bytes: its SASS shows no
    ldmatrix for them."""
    flops: dict[str, float] = {}
    for op, n in loop.items():
        if m := _mma(op):
            flops[m[0]] = flops.get(m[0], 0) + warps * n * m[1]
    wavefronts = warps * sum(n * _wavefronts(op) for op, n in loop.items()) + kv_bytes / 128
    converts = warps * 32 * sum(n for op, n in loop.items() if op.startswith("F2FP") and "UNPACK" in op)
    barriers = sum(n for op, n in loop.items() if op.startswith("BAR.SYNC"))
    return TileWork(mma_flops=flops, smem_wavefronts=wavefronts, convert_lanes=converts,
                    issue=warps / 4 * sum(loop.values()), barriers=barriers, kv_bytes=kv_bytes, keys=keys)
