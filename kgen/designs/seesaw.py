"""sm_90's second wgmma loop (templates/attention_seesaw.cuh): the wgmma loop's producer warpgroup and
ring, with "seesaw" consumers: each of the two consumer warpgroups scores every other KV tile over
all dims and hands its probabilities to the other (O stays split by value dims), so one consumer's
softmax runs under the other's MMAs instead of both exchanging partial scores each tile. bf16 rows,
and fp8 rows in f16 mode (the producer converts them into the bf16 ring, exactly, as the wgmma loop's
does): per-tensor rows, and the DSA pool's 656-B rows (each block scale applied in fp32 to the
block's partial scores and to P, as the wgmma loop does).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from ..arch import Arch
from ..spec import Spec
from .base import Design, TileBox, TileWork, check
from .wgmma import (ALIGN_SLACK, BM, SLAB_ROW, converted_rows, deepest_ring, ring_barriers, ring_config, ring_tile_box,
                    wgmma_tile_work)

Q_REG_STEPS = 8  # Q·K's last k16 steps (the rope, and the latent's last 64 dims) read Q from registers
Q_REG_STEPS_SCALED = 4  # the DSA rows': the rope (their Q·K's latent steps are the 4 scale blocks)
ROW_VALUES = 6  # per-row fp32 values the consumers pass: m0, alpha, m1, beta, two row sums


@dataclass(frozen=True)
class SeesawTiles:
    bn: int = 32
    stages: int = 4
    min_blocks: int = 1

    bm: ClassVar[int] = BM
    threads: ClassVar[int] = 3 * 128
    design: ClassVar[str] = "seesaw"
    cluster: ClassVar[int] = 1  # one CTA a cluster

    def layout(self, spec: Spec) -> dict[str, int]:
        """Shared memory (bytes from a 1 KB-aligned base), as SeesawAttnConfig reads it: the swizzled
        ring (D/64 column blocks of BN rows a stage), Q's first dims in swizzled column blocks, the
        two consumers' probability tiles, the per-row values, the ring's barriers, for fp8 rows two
        raw stages (DSA rows: of the latent), for the DSA pool's rows each stage's block scales, the
        alignment slack."""
        m = spec.model
        check(spec.cache.mma_type in ("bf16", "f16") and m.head_dim - m.value_dim == 64
              and m.value_dim == 512 and self.bn == 32 and self.stages >= 2,
              f"seesaw tiles {self}: the seesaw loop takes a bf16 or fp8 (cache.mma f16) KV cache, "
              f"value width 512, 64 rope dims, BN=32 and at least 2 stages")
        slab, tile = self.bn * SLAB_ROW, BM * SLAB_ROW
        stage_bytes = (m.head_dim // 64) * slab
        q_reg_steps = Q_REG_STEPS_SCALED if spec.cache.per_block else Q_REG_STEPS
        q_slabs = (m.head_dim // 16 - q_reg_steps) // 4
        q_off = self.stages * stage_bytes
        p_off = q_off + q_slabs * tile
        row_off = p_off + 2 * tile
        bar_off = row_off + ROW_VALUES * BM * 4
        end = bar_off + ring_barriers(spec, self.stages) * 8
        layout = {"Q_REG_STEPS": q_reg_steps, "Q_SLABS": q_slabs, "SLAB": slab, "STAGE_BYTES": stage_bytes,
                  "Q_SMEM_OFF": q_off, "Q_SLAB": tile, "P_OFF": p_off, "P_TILE": tile, "ROW_OFF": row_off,
                  "BAR_OFF": bar_off}
        end = converted_rows(spec, self.bn, self.stages, layout, end)
        # the schedule's scratch: the probability tiles are free until the first tile
        return {**layout, "SMEM_BYTES": end + ALIGN_SLACK, "SCRATCH_OFF": p_off}

    def smem_bytes(self, spec: Spec) -> int:
        return self.layout(spec)["SMEM_BYTES"]

    def config(self, spec: Spec) -> str:
        return ring_config(spec, self, "the seesaw loop (kgen/designs/seesaw.py)", "SeesawAttnConfig")

    def describe(self) -> str:
        return (f"seesaw loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, producer warpgroup "
                f"+ 2 consumer warpgroups (alternate tiles, value dims split), {self.stages} stages")


class Seesaw(Design):
    name = "seesaw"
    header = "attention_seesaw.cuh"
    tiles = SeesawTiles
    requires = ("wgmma",)
    sass_expect = ("HGMMA", "LDGSTS")  # warpgroup MMAs fed by cp.async
    modeled = True
    # the consumers take a pair of tiles and release both stages at its end: with 3 stages the next
    # pair's second tile is refilled only then, and each pair waits a copy's latency (NOTES s49m)
    stage_group = 2

    def choose(self, spec: Spec, arch: Arch) -> SeesawTiles:
        """The deepest ring that fits (bf16 rows: 4 stages; fp8 rows: 3 beside the raw stages). The
        H200 measured it 4-16% ahead of the wgmma loop on every shape over bf16 and per-tensor fp8
        rows (bench/NOTES.md v23), and over the DSA pool's rows 5-12% ahead in 20 of the tuner's 24
        buckets at main's code (v37; level at v23)."""
        check(spec.cache.mma_type in ("bf16", "f16"), f"{spec.name}: e4m3 MMAs (cache.mma e4m3) are the mma.sync loop's")
        return deepest_ring(spec, arch, lambda stages: SeesawTiles(stages=stages), "seesaw")

    def tile_box(self, spec: Spec, tiles: SeesawTiles) -> TileBox | None:
        return ring_tile_box(spec, tiles)

    def candidates(self, spec: Spec, arch: Arch) -> list[SeesawTiles]:
        if spec.cache.mma_type not in ("bf16", "f16"):
            return []  # e4m3 MMAs keep mma.sync
        return [t for t in (SeesawTiles(stages=s) for s in (3, 4)) if t.smem_bytes(spec) <= arch.smem_per_block]

    def tile_work(self, spec: Spec, tiles: SeesawTiles, loop: Counter) -> TileWork:
        """The tile loop in the SASS is one consumer's pair of tiles: Q·K of its own tile over all D
        dims and P·V of both over its half of the value dims. Per tile the CTA runs that body once on
        one warpgroup (two consumers, a pair each). Its wgmmas read K (all D dims), Q's shared-memory
        dims, V and the other consumer's probability tile from shared memory themselves."""
        m, bn = spec.model, tiles.bn
        q_smem_steps = m.head_dim // 16 - tiles.layout(spec)["Q_REG_STEPS"]
        operands = m.head_dim // 16 * bn * 32 + q_smem_steps * BM * 32 + m.value_dim * bn * 2 + BM * bn * 2
        return wgmma_tile_work(spec, bn, loop, 4, 1, operands)


DESIGN = Seesaw()
