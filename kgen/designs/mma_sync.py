"""The mma.sync loop (templates/attention.cuh): sm_120's design, also run on the H200 for tests.

BM packed (token, head) rows per CTA; WARPS_M row blocks of DIM_GROUPS warps that split the key
and value dims; one producer warp stages BN-row KV tiles into a STAGES-deep ring with bulk copies;
optionally in clusters of a split's row tiles that multicast each tile to all (for_batch).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import ClassVar

from .. import kvrows
from ..arch import Arch
from ..errors import PlanError
from ..spec import Spec
from .base import Design, TileBox, TileWork, check, render_config, tile_work_from_loop

DIM_GROUPS = 4  # warps split the 576 key dims / 512 value dims into 4 groups
# Row tiles a cluster shares where the GPU multicasts fast (Arch.multicast_fast) and a request has
# more than one: 2 CTAs. On the H200 clusters of 2 took the sm_120 plan's verify 12-16% under
# unclustered tiles at T >= 16, clusters of 4 ran 1.6x slower (bench/NOTES.md v35).
CLUSTER_ROWS = 2
ROW_PAD = 16  # bytes of padding per staged KV, Q and P row: breaks ldmatrix bank conflicts
S_ROW_PAD = 8  # fp32 padding per partial-score row: a half-warp's float2 stores hit 32 banks
P_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1}  # bytes per staged probability, by MMA type (spec.cache.mma_type)
# Arches whose plans keep the DSA rows' block scales in P in f16 mode: sm_120's ptxas spills the V path
# (27 words in verify_attn, 22 in the sparse kernels) at the 168 registers 9 warps leave a thread
# (bench/NOTES.md v45), where the P path compiles clean.
SCALES_IN_P = frozenset({"sm_120"})


@dataclass(frozen=True)
class MmaSyncTiles:
    bm: int  # packed (token, head) rows per CTA
    bn: int  # KV rows per pipeline stage
    warps_m: int  # warps along rows; DIM_GROUPS warps along dims
    stages: int
    min_blocks: int = 1  # CTAs per SM the plan is built for (__launch_bounds__ minimum)
    cluster: int = 1  # CTAs a cluster: the row tiles of a split, each copying 1/cluster of its KV tiles to all
    # DSA rows in f16 mode: 1, the block scales enter P·V through V (one P; 12-17% faster on the H200),
    # or 0, through one copy of P per warp group (templates/attention.cuh). A number: tilings are texts
    scales_in_v: int = 1
    # 1: Q's tile after the barriers, apart from the KV ring (the sparse kernels, where shared memory
    # allows: their copies of Q then overlap the key list's build, which holds the ring), or 0: in the ring
    q_apart: int = 0

    design: ClassVar[str] = "mma_sync"

    @property
    def threads(self) -> int:
        return 32 * (self.warps_m * DIM_GROUPS + 1)  # compute warps and one producer warp

    def layout(self, spec: Spec) -> dict[str, int]:
        """Shared memory of one attention CTA (bytes), as AttnConfig reads it: the KV ring (Q is
        staged through it once, or after the barriers: q_apart), the partial scores of each dim
        group, the probabilities, each row's rescale factor and final 1/l (DSA pool rows: one P and
        these per warp group), and the mbarriers (full and empty per stage, one for Q)."""
        elem, d = kvrows.elem_bytes(spec), spec.model.head_dim
        k_step = 32 // elem  # dims of one MMA k-step
        q_stride = d * 2 + ROW_PAD  # bf16 Q rows
        kv_stride = kvrows.staged_stride(kvrows.row_bytes(spec), ROW_PAD)
        # DSA rows with the scales in P (e4m3 mode, or scales_in_v off): P, alpha and 1/l per warp group
        copies = DIM_GROUPS if spec.cache.per_block and not self.v_scaled(spec) else 1
        ring = self.stages * self.bn * kv_stride
        check(not (self.bm % 16 or self.bm % self.warps_m or (self.bm // self.warps_m) % 16 or self.bn % 16
                   or self.bn % k_step or (self.bm * q_stride > ring and not self.q_apart)
                   or self.cluster not in (1, 2, 4, 8) or self.bn % self.cluster or self.scales_in_v not in (0, 1)
                   or self.q_apart not in (0, 1)),
              f"attention tiles {self}: need BM a multiple of 16, BN a multiple of 16 and of {k_step} "
              f"(one MMA k-step of {spec.cache.kv_dtype}), whole 16-row tiles per warp, "
              f"Q ({self.bm * q_stride} B) within the KV staging buffers ({ring} B), "
              f"clusters of 1, 2, 4 or 8 CTAs that split BN, and SCALES_IN_V and Q_APART 0 or 1")
        s_stride = self.bn + S_ROW_PAD  # floats
        p_stride = self.bn * P_BYTES[spec.cache.mma_type] + ROW_PAD
        s_off = ring
        p_off = s_off + DIM_GROUPS * self.bm * s_stride * 4
        alpha_off = p_off + copies * self.bm * p_stride
        inv_l_off = alpha_off + copies * self.bm * 4
        bar_off = inv_l_off + copies * self.bm * 4
        bar_end = bar_off + (2 * self.stages + 1) * 8
        q_off = -(-bar_end // 128) * 128 if self.q_apart else 0  # a bulk copy's destination: 16 B aligned at least
        return {"KV_STRIDE": kv_stride, "Q_STRIDE": q_stride, "S_STRIDE": s_stride, "P_STRIDE": p_stride,
                "RING_BYTES": ring, "S_OFF": s_off, "P_OFF": p_off, "ALPHA_OFF": alpha_off, "INV_L_OFF": inv_l_off,
                "BAR_OFF": bar_off, "Q_OFF": q_off, "SMEM_BYTES": q_off + self.bm * q_stride if self.q_apart else bar_end,
                "SCALES_IN_V": int(self.v_scaled(spec)),
                "SCRATCH_OFF": s_off}  # the schedule's scratch: the partial scores are free until the first tile

    def smem_bytes(self, spec: Spec) -> int:
        return self.layout(spec)["SMEM_BYTES"]

    def v_scaled(self, spec: Spec) -> bool:
        """Whether the DSA rows' block scales enter P·V through V (AttnConfig::V_SCALED): f16 mode
        with scales_in_v (e4m3 mode's V bytes go to the MMA as they are)."""
        return spec.cache.per_block and spec.cache.mma_type == "f16" and self.scales_in_v == 1

    def config(self, spec: Spec) -> str:
        """The C++ Config (`Cfg`) the kernel is instantiated with, and the layout it reads."""
        m = spec.model
        fp8 = "true" if spec.cache.kv_dtype == "float8_e4m3fn" else "false"
        e4m3 = "true" if spec.cache.mma_type == "e4m3" else "false"
        scaled = "true" if spec.cache.per_block else "false"
        return render_config("the mma.sync loop (kgen/designs/mma_sync.py)", self.layout(spec),
                             f"kgen::AttnConfig<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {self.bm}, {self.bn}, "
                             f"{self.warps_m}, {DIM_GROUPS}, {self.stages}, {fp8}, {e4m3}, {scaled}, {self.cluster}, Layout>")

    def describe(self) -> str:
        return (f"mma.sync loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, "
                f"{self.warps_m}x{DIM_GROUPS} compute warps + 1 producer warp, {self.stages} stages"
                + (f", clusters of {self.cluster} row tiles sharing each KV tile" if self.cluster > 1 else "")
                + ("" if self.scales_in_v else ", DSA block scales through P")
                + (", Q apart from the ring" if self.q_apart else ""))


class MmaSync(Design):
    name = "mma_sync"
    header = "attention.cuh"
    tiles = MmaSyncTiles
    requires = ()
    sass_expect = ("MMA", "UBLKCP")  # tensor-core MMAs fed by bulk copies
    modeled = True

    def choose(self, spec: Spec, arch: Arch) -> MmaSyncTiles:
        """The deepest KV ring of 32x32 tiles that fits shared memory per block (the DSA rows' scales
        in V but where the arch's compiler spills that path: SCALES_IN_P)."""
        for stages in (4, 3, 2):
            t = MmaSyncTiles(bm=32, bn=32, warps_m=2, stages=stages, scales_in_v=_scales_in_v(spec, arch))
            if t.smem_bytes(spec) <= arch.smem_per_block:
                return t
        need, m = t.smem_bytes(spec), spec.model
        raise PlanError(
            f"{spec.name}: model.kv_lora_rank + model.qk_rope_head_dim = {m.head_dim} query dims need {need} B of "
            f"shared memory per attention block with the smallest tiles (BM={t.bm}, BN={t.bn}, 2 stages), but "
            f"{arch.name} allows {arch.smem_per_block} B (over by {need - arch.smem_per_block} B); "
            f"{_widest_fit(spec, arch, t)}"
        )

    def candidates(self, spec: Spec, arch: Arch) -> list[MmaSyncTiles]:
        """A shallow and a deep ring, half-height KV tiles, and the deepest ring of 16-row tiles that
        fits (decode: a request's H rows fill a 16-row tile, half the MMA work of 32; on the H200
        decode B32 L131072 ran 1146 us against 1272-1321 at 32 rows, bench/NOTES.md v67)."""
        v = _scales_in_v(spec, arch)
        short = [t for t in (MmaSyncTiles(16, 32, 1, s, scales_in_v=v) for s in (4, 3, 2))
                 if t.smem_bytes(spec) <= arch.smem_per_block]
        return ([MmaSyncTiles(32, 32, 2, s, scales_in_v=v) for s in (2, 4)] + [MmaSyncTiles(32, 16, 2, 4, scales_in_v=v)]
                + short[:1])

    def tile_box(self, spec: Spec, tiles: MmaSyncTiles) -> TileBox | None:
        """Each CTA's slice of a tile (BN / cluster staged rows, padding included) where pages hold
        whole tiles, so a tile's rows are consecutive slots, and the slice lands 128-byte aligned in
        the ring (a tensor copy's destination) with rows of at most 256 8-byte elements
        (AttnConfig::tile_box_ok: the same rule)."""
        stride, rows = tiles.layout(spec)["KV_STRIDE"], tiles.bn // tiles.cluster
        whole = spec.cache.page_size % tiles.bn == 0 and (rows * stride) % 128 == 0 and stride % 16 == 0
        return TileBox(rows, stride) if whole and stride // 8 <= 256 else None

    def batch_fits(self, tiles: MmaSyncTiles, cubin_arch: Arch) -> list[MmaSyncTiles]:
        return [replace(tiles, cluster=CLUSTER_ROWS)] if _clusters(tiles, cubin_arch) else []

    def for_batch(self, tiles: MmaSyncTiles, cubin_arch: Arch, rows_per_request: float) -> MmaSyncTiles:
        """In clusters of CLUSTER_ROWS where a request has more than one row tile (a ragged batch's
        smaller requests get pad tiles) and multicast is fast on the GPU present; sm_120 is not
        among ptxas's fast targets, so its own GPU runs the loop unclustered until measured."""
        return replace(tiles, cluster=CLUSTER_ROWS) if _clusters(tiles, cubin_arch) and rows_per_request > tiles.bm \
            else tiles

    def tile_work(self, spec: Spec, tiles: MmaSyncTiles, loop: Counter) -> TileWork:
        """The compute warps run the loop; a tile stages BN rows."""
        return tile_work_from_loop(loop, tiles.warps_m * DIM_GROUPS, tiles.bn, tiles.bn * kvrows.row_bytes(spec))


DESIGN = MmaSync()


def _scales_in_v(spec: Spec, arch: Arch) -> int:
    """scales_in_v for a plan of `arch`: 0 for the DSA rows where the arch keeps them in P, else the
    default (1; it only matters for those rows)."""
    return 0 if spec.cache.per_block and arch.name in SCALES_IN_P else 1


def _clusters(tiles: MmaSyncTiles, cubin_arch: Arch) -> bool:
    return tiles.cluster == 1 and cubin_arch.multicast_fast and tiles.bn % CLUSTER_ROWS == 0


def _widest_fit(spec: Spec, arch: Arch, t: MmaSyncTiles) -> str:
    """What to change when a spec's dims do not fit: the widest kv_lora_rank that does at its rope width."""
    m = spec.model
    fits = [r for r in range(64, m.kv_lora_rank, 64)
            if t.smem_bytes(spec.model_copy(update={"model": m.model_copy(update={"kv_lora_rank": r})}))
            <= arch.smem_per_block]
    if not fits:
        return f"no kv_lora_rank fits with qk_rope_head_dim {m.qk_rope_head_dim}: lower model.qk_rope_head_dim"
    return f"at qk_rope_head_dim {m.qk_rope_head_dim}, model.kv_lora_rank may be at most {fits[-1]} on {arch.name}"
