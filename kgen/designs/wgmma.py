"""sm_90's wgmma loop (templates/attention_wgmma.cuh): a producer warpgroup and two consumer
warpgroups that split the dims of 64 packed rows; needs sm_90a's wgmma and setmaxnreg. bf16 rows
are copied into the ring; fp8 rows (cache.mma f16, the default; e4m3 MMAs keep mma.sync) go through
two raw stages and the producer converts their e4m3 bytes to bf16, exactly. Per-tensor rows apply
kv_scale to the scores and O; the DSA pool's rows (cache.scales per_block) apply each block scale in
fp32, to the block's partial scores and to P (bench/NOTES.md v20)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, ClassVar

from ..arch import Arch
from ..spec import Spec
from .. import kvrows
from .base import Design, TileBox, Tiles, TileWork, _mma, check, fitting, render_config, tile_work_from_loop
BM = 64  # packed rows per CTA: one m64 wgmma
# k16 steps of Q·K per consumer with Q in registers (A operand); the rest read smem. The DSA pool's
# rows hold a second score accumulator and a second P (16 + 8 registers): all of Q goes to smem.
Q_REG_STEPS = 12
Q_REG_STEPS_SCALED = 0
SLAB_ROW = 128  # bytes of one row of a 64-dim bf16 column block (the 128-byte swizzle)
ALIGN_SLACK = 1024  # the kernel aligns the dynamic shared-memory base up to 1 KB for the swizzle
FP8_PRODUCER_OPS = 2.5  # SASS instructions per converted e4m3 element (unpack, 2 f16->f32, pack; LDS/STS)
SCALE_BLOCKS = 4  # the DSA row's block scales (512 latent dims / 128)


def raw_row_bytes(spec: Spec) -> int:
    """Bytes of a KV row an fp8 raw stage holds: what the producer converts (DSA rows: the latent,
    the row's first value_dim bytes; per-tensor rows: all of it)."""
    return spec.model.value_dim if spec.cache.per_block else kvrows.row_bytes(spec)


def ring_barriers(spec: Spec, stages: int) -> int:
    """The ring's mbarriers: full and empty per stage, and for fp8 rows one per raw stage (its tensor
    copy landed: templates/wgmma_ring.cuh raw_full)."""
    return 2 * stages + (2 if spec.cache.kv_dtype != "bfloat16" else 0)


def converted_rows(spec: Spec, bn: int, stages: int, layout: dict[str, int], end: int) -> int:
    """What the sm_90 loops' converting producer (templates/wgmma_ring.cuh) adds to a layout from byte
    `end` on, for fp8 rows: two raw stages of BN rows' e4m3 bytes (RAW_OFF, RAW_STAGE_BYTES; DSA rows:
    their latent), and for the DSA pool's rows each ring stage's block scales (SCALE_OFF, [BN][block]
    fp32). Returns the layout's new end."""
    if spec.cache.kv_dtype != "bfloat16":
        raw_row = raw_row_bytes(spec)
        raw_stage = -(-(bn * raw_row) // 128) * 128
        end = -(-end // 128) * 128
        layout.update(RAW_OFF=end, RAW_STAGE_BYTES=raw_stage)
        end += 2 * raw_stage
    if spec.cache.per_block:
        layout.update(SCALE_OFF=end)
        end += stages * SCALE_BLOCKS * bn * 4
    return end


def ring_tile_box(spec: Spec, tiles: Tiles) -> TileBox | None:
    """The sm_90 loops' tensor copies where pages hold whole tiles (WgRing::tile_box_ok: the same
    rule): bf16 rows, each tile one copy per 128-byte column block into the ring, swizzled as the ring
    is; fp8 rows, each tile's raw bytes (raw_row_bytes of each row) one unswizzled copy into a raw
    stage, which the producer converts (bench/NOTES.md v68)."""
    if spec.cache.page_size % tiles.bn:
        return None
    if spec.cache.kv_dtype == "bfloat16":
        return TileBox(tiles.bn, 128, swizzle128=True) if kvrows.row_bytes(spec) % 128 == 0 else None
    raw = raw_row_bytes(spec)
    return TileBox(tiles.bn, raw) if raw % 16 == 0 and raw // 8 <= 256 else None


def ring_config(spec: Spec, tiles, what: str, config: str) -> str:
    """The C++ of an sm_90 loop on the WgRing (templates/wgmma_ring.cuh): its layout and `Cfg`,
    kgen::<config><heads, D, DV, BN, STAGES, fp8 rows, DSA rows, Layout>."""
    m = spec.model
    return render_config(what, tiles.layout(spec),
                         f"kgen::{config}<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {tiles.bn}, "
                         f"{tiles.stages}, {str(spec.cache.kv_dtype != 'bfloat16').lower()}, "
                         f"{str(spec.cache.per_block).lower()}, Layout>")


def deepest_ring(spec: Spec, arch: Arch, tiles_of: Callable[[int], Tiles], loop: str) -> Tiles:
    """An sm_90 loop's tiling with the deepest ring that fits `arch`: 4 stages, else 3, else 2
    (PlanError where even those do not fit)."""
    for stages in (4, 3):
        if tiles_of(stages).smem_bytes(spec) <= arch.smem_per_block:
            return tiles_of(stages)
    return fitting(spec, arch, tiles_of(2), loop)


@dataclass(frozen=True)
class WgmmaTiles:
    bn: int = 32
    stages: int = 4
    min_blocks: int = 1

    bm: ClassVar[int] = BM
    threads: ClassVar[int] = 3 * 128
    design: ClassVar[str] = "wgmma"
    cluster: ClassVar[int] = 1  # one CTA a cluster

    def layout(self, spec: Spec) -> dict[str, int]:
        """Shared memory (bytes from a 1 KB-aligned base), as WgmmaAttnConfig reads it: the swizzled
        ring (D/64 column blocks of BN rows per stage), Q's smem column blocks (each consumer's
        latent dims past its Q_REG_STEPS register k-steps of 16 dims, then the rope's), the
        partial-score exchange [tile parity][consumer][BM x BN fp32], the ring's barriers, for fp8
        rows two raw stages, for the DSA pool's rows each stage's block scales, and the alignment
        slack."""
        m = spec.model
        check(spec.cache.mma_type in ("bf16", "f16") and m.head_dim - m.value_dim == 64
              and m.value_dim == 512 and self.bn == 32 and self.stages >= 2,
              f"wgmma tiles {self}: the wgmma loop takes a bf16 or fp8 (cache.mma f16) KV cache, value "
              f"width 512, 64 rope dims, BN=32 and at least 2 stages")
        q_reg_steps = Q_REG_STEPS_SCALED if spec.cache.per_block else Q_REG_STEPS
        slab, q_slab = self.bn * SLAB_ROW, BM * SLAB_ROW
        q_slabs = 2 * (m.value_dim // 2 - 16 * q_reg_steps) // 64 + (m.head_dim - m.value_dim) // 64
        stage_bytes = (m.head_dim // 64) * slab
        q_off = self.stages * stage_bytes
        x_off = q_off + q_slabs * q_slab
        # the score exchange: [tile parity][consumer][BM x BN] fp32; DSA rows: one BM x BN buffer
        bar_off = x_off + (1 if spec.cache.per_block else 4) * BM * self.bn * 4
        end = bar_off + ring_barriers(spec, self.stages) * 8
        layout = {"Q_REG_STEPS": q_reg_steps, "Q_SLABS": q_slabs, "SLAB": slab, "STAGE_BYTES": stage_bytes,
                  "Q_SMEM_OFF": q_off, "Q_SLAB": q_slab, "X_OFF": x_off, "BAR_OFF": bar_off}
        end = converted_rows(spec, self.bn, self.stages, layout, end)
        # the schedule's scratch: the exchange is free until the first tile
        return {**layout, "SMEM_BYTES": end + ALIGN_SLACK, "SCRATCH_OFF": x_off}

    def smem_bytes(self, spec: Spec) -> int:
        return self.layout(spec)["SMEM_BYTES"]

    def config(self, spec: Spec) -> str:
        """The C++ Config (`Cfg`) the kernel is instantiated with, and the layout it reads."""
        return ring_config(spec, self, "the wgmma loop (kgen/designs/wgmma.py)", "WgmmaAttnConfig")

    def describe(self) -> str:
        return (f"wgmma loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, producer warpgroup "
                f"+ 2 consumer warpgroups (dims split), {self.stages} stages")


class Wgmma(Design):
    name = "wgmma"
    header = "attention_wgmma.cuh"
    tiles = WgmmaTiles
    requires = ("wgmma",)
    sass_expect = ("HGMMA", "LDGSTS")  # warpgroup MMAs fed by cp.async
    modeled = True

    def tile_box(self, spec: Spec, tiles: WgmmaTiles) -> TileBox | None:
        return ring_tile_box(spec, tiles)

    def choose(self, spec: Spec, arch: Arch) -> WgmmaTiles:
        """The deepest ring that fits (bf16 rows: 4 stages; fp8 rows: 3 beside the raw stages, the
        DSA pool's with all of Q in shared memory), where the spec allows the loop. Over fp8 rows
        it beats mma.sync by 1.4-1.8x at long prefixes and trees; per-tensor rows lose up to 12% at
        decode and short prefixes, which their tuned table leaves to mma.sync (bench/NOTES.md v20,
        v20b)."""
        check(spec.cache.mma_type in ("bf16", "f16"),
              f"{spec.name}: e4m3 MMAs (cache.mma e4m3) are the mma.sync loop's")
        return deepest_ring(spec, arch, lambda stages: WgmmaTiles(stages=stages), "wgmma")

    def candidates(self, spec: Spec, arch: Arch) -> list[WgmmaTiles]:
        if spec.cache.mma_type == "bf16":
            return [WgmmaTiles(stages=s) for s in (3, 4)]
        if spec.cache.mma_type != "f16":  # e4m3 MMAs keep mma.sync
            return []
        # e4m3 bytes, exact in bf16 (per-tensor or per-block scales)
        return [t for t in (WgmmaTiles(stages=s) for s in (2, 3)) if t.smem_bytes(spec) <= arch.smem_per_block]

    def tile_work(self, spec: Spec, tiles: WgmmaTiles, loop: Counter) -> TileWork:
        """The 2 consumer warpgroups (8 warps) run the loop. An HGMMA is one warpgroup's MMA (one
        instruction per warp, counted once per warpgroup) at the wgmma rate; the wgmmas read K, V and
        Q's dims past the register k-steps from shared memory themselves (no ldmatrix in the SASS:
        those bytes are added); the producer's cp.async writes the tile."""
        m, consumers = spec.model, 2
        q_reg_steps = tiles.layout(spec)["Q_REG_STEPS"]
        k_steps, q_smem_steps = m.head_dim // 16 // consumers, (m.head_dim - 2 * q_reg_steps * 16) // 16 // consumers
        operands = consumers * (k_steps * tiles.bn * 32 + q_smem_steps * BM * 32 + m.value_dim // consumers * tiles.bn * 2)
        return wgmma_tile_work(spec, tiles.bn, loop, 8, consumers, operands)


def wgmma_tile_work(spec: Spec, bn: int, loop: Counter, warps: int, copies: int, operands: float) -> TileWork:
    """An sm_90 loop's TileWork from its tile loop's opcodes, run `copies` times a tile (by that many
    warpgroups; `warps` warps in all): the warpgroup MMAs (one instruction per warp, counted once per
    warpgroup) at the wgmma rate, with the `operands` bytes of shared memory they read themselves (no
    ldmatrix in the SASS for them); the other instructions as the row-block loop counts them; the
    producer's cp.async writing the tile; and for fp8 rows the producer's conversion (not in the
    consumers' loop): the raw tile read back and the bf16 tile written to shared memory, one
    conversion lane per e4m3 element and FP8_PRODUCER_OPS instructions per element, on the producer's
    4 warps (one per sub-partition); a DSA row's e4m3 bytes are its latent dims."""
    hgmma = Counter({op: n for op, n in loop.items() if op.startswith("HGMMA")})
    rest = tile_work_from_loop(loop - hgmma, warps, bn, bn * kvrows.row_bytes(spec))
    flops = copies * sum(n * _mma(op)[1] for op, n in hgmma.items())
    work = replace(rest, mma_flops={"wgmma_bf16": flops}, smem_wavefronts=rest.smem_wavefronts + operands / 128,
                   issue=rest.issue + warps / 4 * sum(hgmma.values()))
    if spec.cache.kv_dtype == "bfloat16":
        return work
    m = spec.model
    e4m3 = bn * (m.value_dim if spec.cache.per_block else m.head_dim)
    return replace(work, smem_wavefronts=work.smem_wavefronts + (e4m3 + bn * m.head_dim * 2) / 128,
                   convert_lanes=work.convert_lanes + e4m3, issue=work.issue + e4m3 * FP8_PRODUCER_OPS / 32 / 4)


DESIGN = Wgmma()
