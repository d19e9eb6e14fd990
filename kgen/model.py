"""The resource model: how long a spec's attention call takes on an arch, counted from what the
kernel does per KV tile and the arch's per-SM rates — so that it carries over to a GPU we cannot
run (sm_120) from the one we measure on (the H200). It is a model, never a measurement; its
error against H200 measurements is docs/performance_model.md (python -m bench.model_table).

A call (verify_attention; prefix_attention for decode) is one attention CTA per split-KV work
item (templates/schedule.cuh) and the combine kernel. Per KV tile, one CTA costs on its SM

    tensor  = MMA FLOPs / the arch's FLOPs per cycle per SM for the MMA's input type
    smem    = 128-byte shared-memory wavefronts (ldmatrix, lds, sts) + bulk-copy bytes / 128
    convert = fp8 -> f16 conversion lanes / the arch's conversion rate
    issue   = instructions per sub-partition (one per cycle)

counted from the SASS of the kernel's tile loop (kgen.sass.tile_loop) and the plan. The compute
time of a tile is its largest pipe plus the part of the others the loop does not overlap with it,
plus a cost per barrier, at least its issue cycles:

    compute = max(max(pipes) + (1 - overlap) * (sum(pipes) - max(pipes)) + barriers * barrier_cycles,
                  issue / issue_efficiency)

(a sub-partition's few warps issue in only part of its cycles: their dependent instructions wait out
fixed latencies). A tile also brings its KV rows from DRAM; the row tiles of a request run side by
side and share them. All running CTAs share dram_efficiency x the arch's copy bandwidth (x
tensor_copy_gain where pages hold whole tiles: one tensor copy a tile, not a bulk copy a row), and
a stage of the ring is refilled only once the consumers release it, together with the other stages
of the group of tiles they take at once (GROUP: the seesaw's pair 2, else 1), so a tile takes

    tile = max(compute, (latency_us + GROUP * compute) / (GROUP * (STAGES // GROUP)),
               KV bytes the running CTAs read per tile / (dram_efficiency * bandwidth))

Work items run on sm_count x CTAs-per-SM slots in index order (waves); each first pays its
startup, then its tiles. A fluid simulation advances all running CTAs together. Call time = that
makespan + combine_us + the real rows' partial states read once. A work item's startup is what it does
outside its tile loop, the same terms for every design, its bytes from its plan:

    startup = startup_us + (its Q rows + its partial state's BM rows) bytes / item_gbps
              (+ its design's decode_us in a decode call: prefix_attention's own fixed cost)

overlap, barrier_cycles, dram_efficiency, latency_us, issue_efficiency, tensor_copy_gain, startup_us,
item_gbps and combine_us are fitted to H200 measurements (kgen/model_calibration.json) and assumed
to hold on sm_120: they describe the loop design and the memory system's efficiency, the rates
describe the arch.

A loop design (kgen/designs/) gives its TileWork from the SASS of its tile loop (Design.tile_work);
its DESIGN_TERMS are its own where they were fitted on its measurements.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from . import designs, kvrows, sass
from .arch import Arch, get_arch
from .build import build_variant
from .cache import KernelCache
from .designs import Tiles, TileWork
from .errors import KgenError, PlanError
from .kernels import COMBINE, COMBINE_STATE_BATCH
from .occupancy import occupancy
from .plan import Plan, plan
from .model_sim import Item, Shape, simulate, work_items
from .splitkv import ceil_div, row_tiles_of
from .spec import Spec
from .variant import Variant

GRID_T = (16, 64, 256)
GRID_L = (4096, 32768, 131072)
GRID_B = (1, 8, 32)
PIPES = ("tensor", "smem", "convert")


@dataclass(frozen=True)
class Calibration:
    """Constants of the loop design and the memory system, fitted on the H200 (bench.model_table)."""

    overlap: float  # 0: the pipes of a tile work one after another, 1: fully side by side
    barrier_cycles: float  # per barrier a warp waits on per tile (drains the phase before it)
    dram_efficiency: float  # of the copy bandwidth, for bulk copies of scattered KV rows
    latency_us: float  # from a stage's refill to its bytes landing: STAGES tiles per (latency + compute)
    startup_us: float  # per work item: its launch, schedule and first tile's fill (any design)
    item_gbps: float  # per CTA: the rate of a work item's own bytes (its Q rows in, its partial state out)
    combine_us: float  # the combine kernel's launch and its own startup
    state_us: float  # per round of loads in a combine CTA's chain (4 states a group of its threads)
    quantize_us: float  # an fp8 verify call's quantization of bf16 tree keys (torch kernels; not for stored keys)
    decode_us: float = 0.0  # per work item of a decode call (prefix_attention alone): its path's own fixed cost
    issue_efficiency: float = 1.0  # of a sub-partition's cycles it issues in when issue binds (dependent chains)
    tensor_copy_gain: float = 1.0  # DRAM efficiency of tiles staged by one tensor copy over row-by-row copies


CALIBRATION_FILE = Path(__file__).with_name("model_calibration.json")  # written by python -m bench.model_table


@lru_cache(maxsize=None)
def calibration(design: str = "mma_sync") -> Calibration:
    """The calibration of a loop design: the shared terms, and the design's own DESIGN_TERMS where they
    were fitted ("designs" in the file), else the row-block loop's (mma_sync)."""
    data = json.loads(CALIBRATION_FILE.read_text())
    return Calibration(**{**data["calibration"], **data.get("designs", {}).get(design, {})})


# How a loop design's pipes overlap, what its barriers cost and how much of the DRAM bandwidth its
# copies reach are the design's own (fitted on its measurements); a work item's startup, the copy
# latency and the combine's terms are shared by all designs: a design's startup differs by the
# bytes its tiling moves (Call.startup_us), not by a constant of its own, which its long calls
# could not pin (fitted per design, the short calls left out of the fit were 24-27% off). Only a
# decode call's fixed cost (decode_us) is a design's own: the overlap loop's short decodes take
# ~6 us more than its verify calls of the same tiles (bench/NOTES.md, the forty-sixth session).
DESIGN_TERMS = ("overlap", "barrier_cycles", "dram_efficiency", "decode_us")


ROW_TILE_16_TERMS = "mma_sync16"  # terms_of's name for the 16-row mma.sync tiles' terms


def terms_of(tiles) -> str:
    """Whose DESIGN_TERMS a tiling's calls use: its loop design's, but the mma.sync loop's 16-row tiles
    (decode's, bench/NOTES.md v67: one row block a CTA, one warp of rows) have their own. On the H200
    they reach ~85-95% of the DRAM bandwidth at decode where the sm_120 plan's row blocks reach ~65%:
    one set of terms for both fitted neither, and a set shared with every deep-ringed mma.sync tiling
    moved the sm_120 plans' predictions on no measurement of theirs (bench/NOTES.md, the
    twenty-ninth session's refit)."""
    return ROW_TILE_16_TERMS if tiles.design == "mma_sync" and tiles.bm == 16 else tiles.design


def validation() -> str:
    """How far the calibrated model was from the H200 measurements it was checked against."""
    v = json.loads(CALIBRATION_FILE.read_text())["validation"]
    return (f"within {v['max_abs_error_pct']:.0f}% of {v['pairs']} H200 measurements "
            f"(rms {v['rms_error_pct']:.0f}%; docs/performance_model.md)")


# ---- a design's tile: what its loop does per KV tile (kgen/designs/) ----

_LOOPS: dict[tuple[str, str], Counter] = {}  # (variant id, arch) -> its tile loop


def _loop(variant: Variant, arch: str) -> Counter:
    key = (variant.variant_id, arch)
    if key not in _LOOPS:
        built = build_variant(variant, arch, KernelCache())
        _LOOPS[key] = sass.tile_loop(sass.disassemble(built.cubin, "--no-dataflow"))
    return _LOOPS[key]


def modeled(tiles: Tiles) -> bool:
    """Whether the model has an entry for the tiling's loop design."""
    return designs.of(tiles).modeled


def tile_work(p: Plan, arch: Arch, kernel: str | None = None) -> TileWork:
    """What one CTA of the plan does per KV tile on `arch`, from the SASS of its design's loop in
    `kernel` (default: the design's modeled kernel; the sparse model reads the sparse kernels')."""
    design = designs.of(p.tiles)
    if not design.modeled:
        raise KgenError(f"the performance model has no entry for the {design.name} loop "
                        f"(modeled: {', '.join(d.name for d in designs.DESIGNS if d.modeled)})")
    return design.tile_work(p.spec, p.tiles, _loop(p.variant(kernel or design.modeled_kernel), arch.name))


# ---- a call ----

def pipe_cycles(work: TileWork, arch: Arch) -> dict[str, float]:
    """Cycles per tile of each pipe on one SM of `arch`."""
    per_sm_clk = arch.sm_count * arch.clock_ghz * 1e9
    rates = {"bf16": arch.mma_bf16_tflops, "f16": arch.mma_bf16_tflops, "e4m3": arch.mma_fp8_tflops,
             "wgmma_bf16": arch.wgmma_bf16_tflops}
    tensor = sum(f / (rates[k] * 1e12 / per_sm_clk) for k, f in work.mma_flops.items())
    return {"tensor": tensor, "smem": work.smem_wavefronts * 128 / arch.smem_bytes_per_clk,
            "convert": work.convert_lanes / arch.fp8_cvt_per_clk, "issue": work.issue}


def compute_cycles(work: TileWork, arch: Arch, cal: Calibration) -> tuple[float, str]:
    """(cycles, the pipe that binds) of one tile's compute on one SM."""
    c = pipe_cycles(work, arch)
    pipes = [c[p] for p in PIPES]
    top = max(pipes)
    cycles = top + (1 - cal.overlap) * (sum(pipes) - top) + work.barriers * cal.barrier_cycles
    # a sub-partition's few warps wait out their instructions' fixed latencies (ldmatrix -> unpack ->
    # convert -> scale -> MMA): it issues in a fraction of its cycles, not every one
    issue = c["issue"] / cal.issue_efficiency
    if issue > cycles:
        return issue, "issue"
    return cycles, max(PIPES, key=c.get)


def ring_bound_us(tiles: Tiles, latency_us: float, compute_us: float) -> float:
    """The least time a tile takes for its ring: a stage is refilled once the consumers release it, with
    the group of tiles they take together (designs' stage_group), so the ring holds stages // group
    whole groups in flight and each group waits for its copies' latency beyond their lead."""
    group = designs.of(tiles).stage_group
    return (latency_us + group * compute_us) / (group * (tiles.stages // group))


@dataclass(frozen=True)
class Floor:
    """DESIGN §9: max(bytes / DRAM bandwidth, FLOPs / MMA rate) on the arch."""

    bytes: int
    flops: int
    dram_us: float
    mma_us: float

    @property
    def us(self) -> float:
        return max(self.dram_us, self.mma_us)


def floor(spec: Spec, shape: Shape, arch: Arch) -> Floor:
    m = spec.model
    keys = shape.L if shape.decode else shape.L + shape.T
    nbytes = shape.B * keys * kvrows.row_bytes(spec)
    flops = 2 * shape.B * shape.T * shape.H * keys * (m.head_dim + m.value_dim)
    rate = arch.mma_fp8_tflops if spec.cache.mma_type == "e4m3" and arch.mma_fp8_tflops else arch.mma_bf16_tflops
    return Floor(nbytes, flops, nbytes / (arch.dram_gbps * 1e9) * 1e6, flops / (rate * 1e12) * 1e6)


@dataclass(frozen=True)
class Prediction:
    shape: Shape
    arch: str
    tiles: Tiles
    us: float
    binding: str  # tensor/smem/convert/issue (the loop's compute), latency (the ring), dram, per-call
    floor: Floor
    tile_us: float  # one tile's compute
    pipes: dict[str, float]  # cycles per tile of each pipe
    items: int  # work items (attention CTAs with work)

    @property
    def pct_floor(self) -> float:
        return 100 * self.floor.us / self.us

    def utilization(self) -> dict[str, float]:
        """% of each pipe's peak over a tile (what ncu reports for the tile loop)."""
        cycles = self.tile_us * get_arch(self.arch).clock_ghz * 1e3
        return {k: round(100 * v / cycles, 1) for k, v in self.pipes.items()}

    def row(self) -> dict:
        return {**asdict(self.shape), "arch": self.arch, "kind": "model", "tiles": asdict(self.tiles),
                "us": round(self.us, 2), "binding": self.binding, "floor_us": round(self.floor.us, 2),
                "pct_floor": round(self.pct_floor, 1), "tile_us": round(self.tile_us, 4), "items": self.items,
                "pipes": {k: round(v, 1) for k, v in self.pipes.items()}}


@dataclass(frozen=True)
class Call:
    """Everything about one call that does not depend on the calibration."""

    spec: Spec
    shape: Shape
    arch: Arch
    plan: Plan
    work: TileWork
    items: tuple[Item, ...]
    splits: int  # partial states per output row
    combine_slots: int  # combine CTAs (one per output row) that run at once
    combine_rounds: int  # batches of loads in a combine CTA's chain (kgen/kernels.py CombineEntry)
    part_o_bytes: int = 4  # bytes of a partial state's o element (fp32; the sparse kernels' bf16)
    paged_keys: bool = True  # keys are runs of consecutive slots (a prefix); the sparse kernels' are listed slots

    @property
    def slots(self) -> int:
        return self.arch.sm_count * self.plan.tiles.min_blocks

    @property
    def item_bytes(self) -> float:
        """Bytes a work item moves outside its tile loop: its request's share of Q rows (bf16) in, and
        its partial state out, every one of the BM rows (templates/attention.cuh attend_end)."""
        m, t, s = self.spec.model, self.plan.tiles, self.shape
        q_rows = s.T * s.H / row_tiles_of(s.T, s.H, t.bm, t.cluster)
        return q_rows * m.head_dim * 2 + t.bm * (m.value_dim * self.part_o_bytes + 4)

    def startup_us(self, cal: Calibration) -> float:
        """What a work item pays before its tiles: the shared per-item cost, and its own bytes at the
        per-CTA rate (a 16-row decode CTA starts sooner than a verify CTA of 64 rows)."""
        return cal.startup_us + self.item_bytes / (cal.item_gbps * 1e3) + (cal.decode_us if self.shape.decode else 0.0)

    def dram_efficiency(self, cal: Calibration) -> float:
        """Of the copy bandwidth, what the call's KV copies reach: where pages hold whole tiles a tile is
        one tensor copy (Design.tile_box), not a bulk copy a row (bench/NOTES.md v40: -7.5% at decode);
        listed keys (sparse) are scattered slots, a bulk copy each."""
        whole_tiles = self.paged_keys and designs.of(self.plan.tiles).tile_box(self.spec, self.plan.tiles) is not None
        return min(1.0, cal.dram_efficiency * (cal.tensor_copy_gain if whole_tiles else 1.0))

    def predict(self, cal: Calibration | None = None) -> Prediction:
        cal = cal or calibration(terms_of(self.plan.tiles))
        cycles, pipe = compute_cycles(self.work, self.arch, cal)
        compute_us = cycles / (self.arch.clock_ghz * 1e3)
        ring_us = ring_bound_us(self.plan.tiles, cal.latency_us, compute_us)
        if ring_us > compute_us:
            compute_us, pipe = ring_us, "latency"
        return self.finish(cal, compute_us, pipe, self.startup_us(cal))

    def finish(self, cal: Calibration, compute_us: float, pipe: str, startup: float) -> Prediction:
        """The call's time once a tile's compute and an item's startup are known: the items' makespan
        on the GPU's slots, then the combine."""
        arch, spec, shape = self.arch, self.spec, self.shape
        bandwidth = self.dram_efficiency(cal) * arch.dram_gbps * 1e3  # bytes per us
        makespan, dram_bound = simulate(self.items, self.slots, compute_us, bandwidth, startup)
        # the combine: one CTA per output row reads the row's states, a latency chain of
        # combine_rounds batches per wave of rows, or all states at the DRAM bandwidth — unless they
        # are still in L2: a call whose KV and partials fit half of it (a server's layers, and the
        # bench's rotated calls, share one workspace: bench/NOTES.md v30) rewrites and rereads lines
        # the previous call left there
        rows = shape.B * shape.T * shape.H
        state_bytes = spec.model.value_dim * self.part_o_bytes + 4
        partials = len(self.items) * self.plan.tiles.bm * state_bytes  # written: every one of an item's BM rows
        kv_bytes = sum(it.tiles * it.dram_bytes for it in self.items)
        # read back: the real rows' states only (a decode item's 32-row tile holds 8 real rows)
        from_dram = 0 if partials + kv_bytes <= arch.l2_mb * 1e6 / 2 else rows * self.splits * state_bytes
        chains = ceil_div(rows, self.combine_slots) * self.combine_rounds * cal.state_us
        combine = cal.combine_us + max(chains, (from_dram + rows * spec.model.value_dim * 2) / (arch.dram_gbps * 1e3))
        if spec.cache.kv_dtype != "bfloat16" and not shape.decode and not shape.stored_tree:
            combine += cal.quantize_us  # (per-call time, counted with the combine)
        us = makespan + combine
        per_call = combine + startup * ceil_div(len(self.items), self.slots)  # startups per wave, combine
        shares = {"dram": dram_bound, pipe: us - dram_bound - per_call, "per-call": per_call}
        return Prediction(shape, arch.name, self.plan.tiles, us, max(shares, key=shares.get),
                          floor(spec, shape, arch), compute_us, pipe_cycles(self.work, arch), len(self.items))


def call(spec: Spec, shape: Shape, arch: str | Arch, *, plan_for: str | None = None,
         tiles: Tiles | None = None) -> Call:
    """One call of `shape` on `arch` with the plan for `plan_for` (default: the spec's target; the
    sm_120 plan also runs on the H200), or with `tiles`."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    p = plan(spec, plan_for, tiles)
    work = tile_work(p, arch)
    items, splits = work_items(p, shape, arch.sm_count * p.tiles.min_blocks)
    return Call(spec, shape, arch, p, work, tuple(items), splits, *combine_shape(p, shape, arch, len(items), splits))


def combine_shape(p: Plan, shape: Shape, arch: Arch, items: int, splits: int) -> tuple[int, int]:
    """(combine CTAs that run at once, batches of loads in each one's chain) for a call of `items`
    work items and `splits` states a row, the combine launched as a prepared step launches it."""
    combine = build_variant(p.variant("lse_combine"), arch.name, KernelCache())
    rows = shape.B * shape.T * shape.H
    threads = COMBINE.threads(p.spec.model.value_dim, rows, items, p.tiles.bm, shape.B, arch.sm_count)
    groups = threads // (p.spec.model.value_dim // 4)
    ctas = occupancy(arch, threads, combine.report.registers, combine.smem_bytes).ctas_per_sm
    return arch.sm_count * ctas, ceil_div(splits, groups * COMBINE_STATE_BATCH)


def predict(spec: Spec, shape: Shape, arch: str | Arch, *, plan_for: str | None = None,
            tiles: Tiles | None = None, cal: Calibration | None = None) -> Prediction:
    """Modeled time of one call (see call())."""
    return call(spec, shape, arch, plan_for=plan_for, tiles=tiles).predict(cal)


def grid(spec: Spec) -> list[Shape]:
    """The §9 grid at the spec's H and page size (T up to the spec's tree; a static tree has its own)."""
    nodes = spec.tree.nodes
    ts = [nodes] if spec.tree.is_static else [t for t in GRID_T if t <= nodes] or [nodes]
    return [Shape(spec.model.num_q_heads, t, l, b, spec.cache.page_size) for t in ts for l in GRID_L for b in GRID_B]


def rank_by_model(spec: Spec, arch: str | Arch, candidates: list[Tiles],
                  shapes: list[Shape] | None = None) -> list[tuple[Tiles, float]]:
    """Candidate tilings that plan for `arch`, fastest first by the model: (tiles, the geometric
    mean of their modeled µs over `shapes`, default the §9 grid). For `kgen tune` where the arch
    is not present; the ranking is a model, and the caller says so."""
    shapes = shapes or grid(spec)
    arch_name = arch if isinstance(arch, str) else arch.name
    ranked = []
    for t in candidates:
        try:
            times = [predict(spec, s, arch, plan_for=arch_name, tiles=t).us for s in shapes]
        except PlanError:
            continue
        ranked.append((t, math.exp(sum(map(math.log, times)) / len(times))))
    return sorted(ranked, key=lambda r: r[1])
