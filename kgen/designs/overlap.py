"""sm_120's second mma.sync loop (templates/attention_overlap.cuh): 8 warps that each own all 32
rows, so each K and V fragment is read from shared memory once per CTA (Q·K split 4 dim groups x
2 key halves, P·V 8 x 64 value dims); no producer warp (every warp stages its share of each tile);
with `ahead`, Q·K of the next tile runs under this tile's softmax. bf16 KV only.

Not the planner's choice (it comes after the row-block loop in designs.DESIGNS): on the H200 it
measured slower than the row-block loop (bench/NOTES.md v15); `kgen tune` and tiles overrides run it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from .. import kvrows
from ..arch import Arch
from ..spec import Spec
from .base import Design, TileWork, check, fitting, render_config, tile_work_from_loop
from .mma_sync import DIM_GROUPS, ROW_PAD, S_ROW_PAD

BM = 32  # packed rows per CTA: 2 m16 tiles in every warp
WARPS = 8


@dataclass(frozen=True)
class OverlapTiles:
    bn: int = 16  # KV rows per stage: 16 or 32
    stages: int = 4
    ahead: int = 1  # 1: Q·K one tile ahead (needs 3+ stages), 0: one tile at a time
    min_blocks: int = 1

    bm: ClassVar[int] = BM
    threads: ClassVar[int] = WARPS * 32
    design: ClassVar[str] = "overlap"
    cluster: ClassVar[int] = 1  # one CTA a cluster

    def layout(self, spec: Spec) -> dict[str, int]:
        """Shared memory (bytes), as OverlapAttnConfig reads it: the KV ring (Q is staged through it
        once), the partial scores of each dim group, the probabilities, each row's rescale factor and
        final 1/l, and the mbarriers (full per stage, one for Q)."""
        m = spec.model
        kv_stride, q_stride = m.head_dim * 2 + ROW_PAD, m.head_dim * 2 + ROW_PAD
        ring = self.stages * self.bn * kv_stride
        check(spec.cache.kv_dtype == "bfloat16" and self.bn in (16, 32) and self.ahead in (0, 1)
              and self.stages >= 2 + self.ahead and m.value_dim % (WARPS * 16) == 0
              and (m.head_dim - m.value_dim) % 16 == 0 and m.head_dim - m.value_dim <= 16 * DIM_GROUPS
              and BM * q_stride <= ring,
              f"overlap tiles {self}: the overlap loop takes a bf16 KV cache, BN 16 or 32, 2+ stages (3+ with "
              f"Q·K ahead: the next tile's stage must be refilled before it is waited for), value width a "
              f"multiple of 128, at most 4 rope k-steps of 16 dims, and Q ({BM * q_stride} B) within the ring "
              f"({ring} B)")
        s_stride = self.bn + S_ROW_PAD  # floats
        p_stride = self.bn * 2 + ROW_PAD
        s_off = ring
        p_off = s_off + DIM_GROUPS * BM * s_stride * 4
        alpha_off = p_off + BM * p_stride
        inv_l_off = alpha_off + BM * 4
        bar_off = inv_l_off + BM * 4
        return {"KV_STRIDE": kv_stride, "Q_STRIDE": q_stride, "S_STRIDE": s_stride, "P_STRIDE": p_stride,
                "RING_BYTES": ring, "S_OFF": s_off, "P_OFF": p_off, "ALPHA_OFF": alpha_off, "INV_L_OFF": inv_l_off,
                "BAR_OFF": bar_off, "SMEM_BYTES": bar_off + (self.stages + 1) * 8,
                "SCRATCH_OFF": s_off}  # the schedule's scratch: the partial scores are free until the first tile

    def smem_bytes(self, spec: Spec) -> int:
        return self.layout(spec)["SMEM_BYTES"]

    def config(self, spec: Spec) -> str:
        m = spec.model
        ahead = "true" if self.ahead else "false"
        return render_config("the overlap loop (kgen/designs/overlap.py)", self.layout(spec),
                             f"kgen::OverlapAttnConfig<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {self.bn}, "
                             f"{self.stages}, {ahead}, Layout>")

    def describe(self) -> str:
        return (f"overlap loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, 8 warps on all rows "
                f"(4 dim groups x 2 key halves for QK, 8 x 64 value dims for PV), {self.stages} stages"
                + (", QK one tile ahead" if self.ahead else ""))


class Overlap(Design):
    name = "overlap"
    header = "attention_overlap.cuh"
    tiles = OverlapTiles
    requires = ()
    sass_expect = ("MMA", "UBLKCP")  # tensor-core MMAs fed by bulk copies
    modeled = True
    heuristic = False  # measured slower than the row-block loop so far (bench/NOTES.md v15)

    def choose(self, spec: Spec, arch: Arch) -> OverlapTiles:
        """16-key tiles, 4 stages, Q·K ahead, where the spec (bf16) and shared memory allow it."""
        return fitting(spec, arch, OverlapTiles(), "overlap")

    def candidates(self, spec: Spec, arch: Arch) -> list[OverlapTiles]:
        """With and without Q·K ahead, and 32-key tiles on a 2-stage ring."""
        if spec.cache.kv_dtype != "bfloat16":
            return []
        return [OverlapTiles(16, 4, 1), OverlapTiles(16, 4, 0), OverlapTiles(32, 2, 0)]

    def tile_work(self, spec: Spec, tiles: OverlapTiles, loop: Counter) -> TileWork:
        """The 8 warps run the loop; a tile stages BN rows."""
        return tile_work_from_loop(loop, WARPS, tiles.bn, tiles.bn * kvrows.row_bytes(spec))


DESIGN = Overlap()
