"""sm_90's wgmma loop (templates/attention_wgmma.cuh): a producer warpgroup and two consumer
warpgroups that split the dims of 64 packed rows; needs sm_90a's wgmma and setmaxnreg."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..arch import Arch
from ..errors import PlanError
from ..spec import Spec
from .base import Design, check, render_config

BM = 64  # packed rows per CTA: one m64 wgmma
Q_REG_STEPS = 12  # k16 steps of Q·K per consumer with Q in registers (A operand); the rest read smem
SLAB_ROW = 128  # bytes of one row of a 64-dim bf16 column block (the 128-byte swizzle)
ALIGN_SLACK = 1024  # the kernel aligns the dynamic shared-memory base up to 1 KB for the swizzle


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
        check(spec.cache.kv_dtype == "bfloat16" and m.head_dim % 64 == 0 and m.value_dim == 512 and self.bn == 32
              and self.stages >= 2,
              f"wgmma tiles {self}: the wgmma loop takes a bf16 KV cache, value width 512, "
              f"key width a multiple of 64, BN=32 and at least 2 stages")
        slab, q_slab = self.bn * SLAB_ROW, BM * SLAB_ROW
        q_smem_dim0 = 2 * Q_REG_STEPS * 16
        stage_bytes = (m.head_dim // 64) * slab
        q_off = self.stages * stage_bytes
        x_off = q_off + ((m.head_dim - q_smem_dim0) // 64) * q_slab
        bar_off = x_off + 4 * BM * self.bn * 4
        return {"Q_REG_STEPS": Q_REG_STEPS, "Q_SMEM_DIM0": q_smem_dim0, "SLAB": slab, "STAGE_BYTES": stage_bytes,
                "Q_SMEM_OFF": q_off, "Q_SLAB": q_slab, "X_OFF": x_off, "BAR_OFF": bar_off,
                "SMEM_BYTES": bar_off + 2 * self.stages * 8 + ALIGN_SLACK,
                "SCRATCH_OFF": x_off}  # the schedule's scratch: the exchange is free until the first tile

    def smem_bytes(self, spec: Spec) -> int:
        return self.layout(spec)["SMEM_BYTES"]

    def config(self, spec: Spec) -> str:
        """The C++ Config (`Cfg`) the kernel is instantiated with, and the layout it reads."""
        m = spec.model
        return render_config("the wgmma loop (kgen/designs/wgmma.py)", self.layout(spec),
                             f"kgen::WgmmaAttnConfig<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {self.bn}, "
                             f"{self.stages}, Layout>")

    def describe(self) -> str:
        return (f"wgmma loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, producer warpgroup "
                f"+ 2 consumer warpgroups (dims split), {self.stages} stages")


class Wgmma(Design):
    name = "wgmma"
    header = "attention_wgmma.cuh"
    tiles = WgmmaTiles
    requires = ("wgmma",)
    sass_expect = ("HGMMA", "LDGSTS")  # warpgroup MMAs fed by cp.async
    # tile_work: none yet (the model reads mma.sync loops; wgmma's MMAs read shared memory themselves)

    def choose(self, spec: Spec, arch: Arch) -> WgmmaTiles:
        """A 4-stage ring where the spec allows the loop and it fits."""
        t = WgmmaTiles()
        if t.smem_bytes(spec) > arch.smem_per_block:
            raise PlanError(f"{spec.name}: the wgmma loop needs {t.smem_bytes(spec)} B of shared memory per block; "
                            f"{arch.name} allows {arch.smem_per_block} B")
        return t

    def candidates(self, spec: Spec, arch: Arch) -> list[WgmmaTiles]:
        return [WgmmaTiles(stages=s) for s in (3, 4)] if spec.cache.kv_dtype == "bfloat16" else []


DESIGN = Wgmma()
