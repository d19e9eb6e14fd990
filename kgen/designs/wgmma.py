"""sm_90's wgmma loop (templates/attention_wgmma.cuh): a producer warpgroup and two consumer
warpgroups that split the dims of 64 packed rows; needs sm_90a's wgmma and setmaxnreg. bf16 rows
are copied into the ring; per-tensor fp8 rows (one kv_scale) go through two raw stages and the
producer converts them to bf16, exactly (cache.mma f16, the default; e4m3 MMAs keep mma.sync). The
DSA pool's rows (cache.scales per_block) keep mma.sync: a bf16 ring rounds e4m3 x block scale to 8
bits, outside DESIGN §6's f16-mode tolerance (bench/NOTES.md v17, measured)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import ClassVar

from ..arch import Arch
from ..spec import Spec
from .. import kvrows
from .base import Design, TileWork, _mma, check, fitting, render_config, tile_work_from_loop
BM = 64  # packed rows per CTA: one m64 wgmma
Q_REG_STEPS = 12  # k16 steps of Q·K per consumer with Q in registers (A operand); the rest read smem
SLAB_ROW = 128  # bytes of one row of a 64-dim bf16 column block (the 128-byte swizzle)
ALIGN_SLACK = 1024  # the kernel aligns the dynamic shared-memory base up to 1 KB for the swizzle
FP8_PRODUCER_OPS = 2.5  # SASS instructions per converted e4m3 element (unpack, 2 f16->f32, pack; LDS/STS)


@dataclass(frozen=True)
class WgmmaTiles:
    bn: int = 32
    stages: int = 4
    min_blocks: int = 1

    bm: ClassVar[int] = BM
    threads: ClassVar[int] = 3 * 128
    design: ClassVar[str] = "wgmma"

    def layout(self, spec: Spec) -> dict[str, int]:
        """Shared memory (bytes from a 1 KB-aligned base), as WgmmaAttnConfig reads it: the swizzled
        ring (D/64 column blocks of BN rows per stage), Q's dims from Q_SMEM_DIM0 on (its registers
        hold Q_REG_STEPS k-steps of 16 dims per consumer), the partial-score exchange [tile parity]
        [consumer][BM x BN fp32], the ring's barriers, and the alignment slack."""
        m = spec.model
        check(spec.cache.mma_type in ("bf16", "f16") and not spec.cache.per_block and m.head_dim % 64 == 0
              and m.value_dim == 512 and self.bn == 32 and self.stages >= 2,
              f"wgmma tiles {self}: the wgmma loop takes a bf16 or per-tensor fp8 (cache.mma f16) KV cache, value "
              f"width 512, key width a multiple of 64, BN=32 and at least 2 stages")
        slab, q_slab = self.bn * SLAB_ROW, BM * SLAB_ROW
        q_smem_dim0 = 2 * Q_REG_STEPS * 16
        stage_bytes = (m.head_dim // 64) * slab
        q_off = self.stages * stage_bytes
        x_off = q_off + ((m.head_dim - q_smem_dim0) // 64) * q_slab
        bar_off = x_off + 4 * BM * self.bn * 4
        end = bar_off + 2 * self.stages * 8
        layout = {"Q_REG_STEPS": Q_REG_STEPS, "Q_SMEM_DIM0": q_smem_dim0, "SLAB": slab, "STAGE_BYTES": stage_bytes,
                  "Q_SMEM_OFF": q_off, "Q_SLAB": q_slab, "X_OFF": x_off, "BAR_OFF": bar_off}
        if spec.cache.kv_dtype != "bfloat16":  # two raw stages of fp8 rows
            raw_stage = -(-(self.bn * kvrows.row_bytes(spec)) // 128) * 128
            end = -(-end // 128) * 128
            layout.update(RAW_OFF=end, RAW_STAGE_BYTES=raw_stage)
            end += 2 * raw_stage
        # the schedule's scratch: the exchange is free until the first tile
        return {**layout, "SMEM_BYTES": end + ALIGN_SLACK, "SCRATCH_OFF": x_off}

    def smem_bytes(self, spec: Spec) -> int:
        return self.layout(spec)["SMEM_BYTES"]

    def config(self, spec: Spec) -> str:
        """The C++ Config (`Cfg`) the kernel is instantiated with, and the layout it reads."""
        m = spec.model
        return render_config("the wgmma loop (kgen/designs/wgmma.py)", self.layout(spec),
                             f"kgen::WgmmaAttnConfig<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {self.bn}, "
                             f"{self.stages}, {str(spec.cache.kv_dtype != 'bfloat16').lower()}, Layout>")

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

    def choose(self, spec: Spec, arch: Arch) -> WgmmaTiles:
        """A 4-stage ring where the spec allows the loop and it fits. fp8 rows stay a tuning
        candidate until a GPU has measured them against the mma.sync loop (bench/NOTES.md v17)."""
        check(spec.cache.kv_dtype == "bfloat16",
              f"{spec.name}: the wgmma loop over fp8 rows runs where asked for (tiles, kgen tune), not by default yet")
        return fitting(spec, arch, WgmmaTiles(), "wgmma")

    def candidates(self, spec: Spec, arch: Arch) -> list[WgmmaTiles]:
        if spec.cache.mma_type == "bf16":
            return [WgmmaTiles(stages=s) for s in (3, 4)]
        fp8_rows = spec.cache.mma_type == "f16" and not spec.cache.per_block  # per-tensor e4m3, exact in bf16
        return [WgmmaTiles(stages=s) for s in (2, 3)] if fp8_rows else []

    def tile_work(self, spec: Spec, tiles: WgmmaTiles, loop: Counter) -> TileWork:
        """The 2 consumer warpgroups (8 warps) run the loop. An HGMMA is one warpgroup's MMA (one
        instruction per warp, counted once per warpgroup) at the wgmma rate; the wgmmas read K, V and
        Q's dims past the register k-steps from shared memory themselves (no ldmatrix in the SASS:
        those bytes are added); the producer's cp.async writes the tile."""
        m, consumers, warps = spec.model, 2, 8
        hgmma = Counter({op: n for op, n in loop.items() if op.startswith("HGMMA")})
        rest = tile_work_from_loop(loop - hgmma, warps, tiles.bn, tiles.bn * kvrows.row_bytes(spec))
        flops = consumers * sum(n * _mma(op)[1] for op, n in hgmma.items())
        k_steps, q_smem_steps = m.head_dim // 16 // consumers, (m.head_dim - 2 * Q_REG_STEPS * 16) // 16 // consumers
        operands = consumers * (k_steps * tiles.bn * 32 + q_smem_steps * BM * 32 + m.value_dim // consumers * tiles.bn * 2)
        work = replace(rest, mma_flops={"wgmma_bf16": flops}, smem_wavefronts=rest.smem_wavefronts + operands / 128,
                       issue=rest.issue + warps / 4 * sum(hgmma.values()))
        if spec.cache.kv_dtype == "bfloat16":
            return work
        # fp8 rows: the producer's conversion (not in the consumers' loop): the raw tile read back
        # and the bf16 tile written to shared memory, one conversion lane per e4m3 element and
        # FP8_PRODUCER_OPS instructions per element, on the producer's 4 warps (one per sub-partition)
        e4m3 = tiles.bn * m.head_dim
        return replace(work, smem_wavefronts=work.smem_wavefronts + tiles.bn * (e4m3 + m.head_dim * 2) / 128,
                       convert_lanes=work.convert_lanes + e4m3, issue=work.issue + e4m3 * FP8_PRODUCER_OPS / 32 / 4)


DESIGN = Wgmma()
