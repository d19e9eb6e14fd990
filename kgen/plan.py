"""Plan: turn a spec into kernel variants (tiles, threads, stages, constants, signature) that fit
the target arch's limits.

Each Variant is one extern "C" entry point in one rendered source file. The planner owns the
shared-memory budget: it computes each kernel's footprint from the same constants the template
uses (the template static_asserts that the two agree) and refuses a plan over the arch's limit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import ClassVar

from .arch import Arch, get_arch
from .errors import PlanError
from .signature import Param
from .spec import Spec

LOG2E = 1.4426950408889634

# Attention tiling that does not depend on the arch (see templates/attention.cuh).
DIM_GROUPS = 4  # warps split the 576 key dims / 512 value dims into 4 groups
ROW_PAD = 16  # bytes of padding per staged KV, Q and P row: breaks ldmatrix bank conflicts
S_ROW_PAD = 8  # fp32 padding per partial-score row: a half-warp's float2 stores hit 32 banks
WGMMA_Q_REG_DIMS = 384  # the wgmma loop keeps Q's first 384 dims in registers (WgmmaAttnConfig::Q_SMEM_DIM0)
KV_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1}  # bytes per KV element
KV_CTYPES = {"bfloat16": "__nv_bfloat16", "float8_e4m3fn": "unsigned char"}
P_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1}  # bytes per staged probability, by MMA type (spec.cache.mma_type)


@dataclass(frozen=True)
class Variant:
    kernel: str  # which of the kernels: prefix_attn, tree_attn, lse_merge, kv_defrag
    name: str  # what this entry point does, e.g. "lse_merge_bf16"
    template: str  # templates/<template>
    threads: int
    smem_bytes: int  # dynamic shared memory per block
    min_blocks: int  # second __launch_bounds__ argument: the occupancy the plan is built for
    constants: dict[str, object]  # injected into the template
    params: tuple[Param, ...]
    tag: str  # human-readable part of the id: h8_d576_ps1_bf16_sm120
    requires: tuple[str, ...] = ()  # arch features the cubin needs (e.g. "wgmma": only sm_90a runs it)
    sass_expect: tuple[str, ...] = ()  # instruction classes (kgen.sass) the compiled loop must contain

    @property
    def digest(self) -> str:
        blob = json.dumps(
            [self.template, self.threads, self.smem_bytes, self.min_blocks, self.constants,
             [(p.name, p.ctype) for p in self.params]],
            sort_keys=True, default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def variant_id(self) -> str:
        """Readable and unique; also the extern "C" symbol."""
        return f"{self.name}__{self.tag}__{self.digest}"


@dataclass(frozen=True)
class AttentionTiles:
    """The mma.sync loop (templates/attention.cuh): sm_120's design, also run on the H200 for tests."""

    bm: int  # packed (token, head) rows per CTA
    bn: int  # KV rows per pipeline stage
    warps_m: int  # warps along rows; DIM_GROUPS warps along dims
    stages: int
    min_blocks: int = 1  # CTAs per SM the plan is built for (__launch_bounds__ minimum)

    design: ClassVar[str] = "mma_sync"
    header: ClassVar[str] = "attention.cuh"
    requires: ClassVar[tuple[str, ...]] = ()  # arch features beyond mma.sync, ldmatrix and bulk copies
    sass_expect: ClassVar[tuple[str, ...]] = ("MMA", "UBLKCP")  # tensor-core MMAs fed by bulk copies

    @property
    def threads(self) -> int:
        return 32 * (self.warps_m * DIM_GROUPS + 1)  # compute warps and one producer warp

    def smem_bytes(self, spec: Spec) -> int:
        """Shared memory of one attention CTA; mirrors the layout in templates/attention.cuh."""
        d, elem = spec.model.head_dim, KV_BYTES[spec.cache.kv_dtype]
        kv = self.stages * self.bn * (d * elem + ROW_PAD)
        s_part = DIM_GROUPS * self.bm * (self.bn + S_ROW_PAD) * 4
        p = self.bm * (self.bn * P_BYTES[spec.cache.mma_type] + ROW_PAD)
        stats = 2 * self.bm * 4  # per-row rescale factor and final 1/l
        barriers = (2 * self.stages + 1) * 8  # full and empty mbarrier per stage, one for Q
        q_stage = self.bm * (d * 2 + ROW_PAD)  # bf16 Q is staged once through the KV buffers
        k_step = 32 // elem  # dims of one MMA k-step
        if (self.bm % 16 or self.bm % self.warps_m or (self.bm // self.warps_m) % 16 or self.bn % 16
                or self.bn % k_step or q_stage > kv):
            raise PlanError(f"attention tiles {self}: need BM a multiple of 16, BN a multiple of 16 and of {k_step} "
                            f"(one MMA k-step of {spec.cache.kv_dtype}), whole 16-row tiles per warp, "
                            f"and Q ({q_stage} B) within the KV staging buffers ({kv} B)")
        return kv + s_part + p + stats + barriers

    def config(self, spec: Spec) -> str:
        """The C++ Config type the kernel is instantiated with."""
        m = spec.model
        fp8 = "true" if spec.cache.kv_dtype == "float8_e4m3fn" else "false"
        e4m3 = "true" if spec.cache.mma_type == "e4m3" else "false"
        return (f"kgen::AttnConfig<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {self.bm}, {self.bn}, "
                f"{self.warps_m}, {DIM_GROUPS}, {self.stages}, {fp8}, {e4m3}, {S_ROW_PAD}>")

    def describe(self) -> str:
        return (f"mma.sync loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, "
                f"{self.warps_m}x{DIM_GROUPS} compute warps + 1 producer warp, {self.stages} stages")


@dataclass(frozen=True)
class WgmmaTiles:
    """sm_90's wgmma loop (templates/attention_wgmma.cuh): a producer warpgroup and two consumer
    warpgroups that split the dims of 64 packed rows; needs sm_90a's wgmma and setmaxnreg."""

    bn: int = 32
    stages: int = 4
    min_blocks: int = 1

    bm: ClassVar[int] = 64
    threads: ClassVar[int] = 3 * 128
    design: ClassVar[str] = "wgmma"
    header: ClassVar[str] = "attention_wgmma.cuh"
    requires: ClassVar[tuple[str, ...]] = ("wgmma",)
    sass_expect: ClassVar[tuple[str, ...]] = ("HGMMA", "LDGSTS")  # warpgroup MMAs fed by cp.async

    def smem_bytes(self, spec: Spec) -> int:
        """Mirrors WgmmaAttnConfig: the swizzled ring, Q's dims from 384 on (its registers hold 12
        k-steps of 16 dims per consumer), the partial-score exchange, barriers, and 1 KB to align
        the base for the swizzle."""
        m = spec.model
        if (spec.cache.kv_dtype != "bfloat16" or m.head_dim % 64 or m.value_dim != 512 or self.bn != 32
                or self.stages < 2):
            raise PlanError(f"wgmma tiles {self}: the wgmma loop takes a bf16 KV cache, value width 512, "
                            f"key width a multiple of 64, BN=32 and at least 2 stages")
        ring = self.stages * m.head_dim * 2 * self.bn
        q_smem = (m.head_dim - WGMMA_Q_REG_DIMS) * 2 * self.bm
        exchange = 4 * self.bm * self.bn * 4
        return ring + q_smem + exchange + 2 * self.stages * 8 + 1024

    def config(self, spec: Spec) -> str:
        m = spec.model
        return f"kgen::WgmmaAttnConfig<{m.num_q_heads}, {m.head_dim}, {m.value_dim}, {self.bn}, {self.stages}>"

    def describe(self) -> str:
        return (f"wgmma loop: BM={self.bm} packed (token, head) rows, BN={self.bn} KV rows, producer warpgroup "
                f"+ 2 consumer warpgroups (dims split), {self.stages} stages")


Tiles = AttentionTiles | WgmmaTiles


@dataclass(frozen=True)
class Plan:
    spec: Spec
    arch: Arch
    tiles: Tiles
    variants: tuple[Variant, ...]
    budget: dict[str, int] = field(default_factory=dict)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


def attention_smem_bytes(spec: Spec, t: Tiles) -> int:
    return t.smem_bytes(spec)


def _fits(arch: Arch, smem: int) -> bool:
    return smem <= arch.smem_per_block


def wgmma_fits(spec: Spec, arch: Arch) -> bool:
    """Whether the wgmma loop can run this spec on this arch."""
    try:
        return arch.wgmma and _fits(arch, WgmmaTiles().smem_bytes(spec))
    except PlanError:
        return False


def choose_attention_tiles(spec: Spec, arch: Arch) -> Tiles:
    """The arch's own loop design: wgmma where the arch has it and the spec allows it (4 stages);
    otherwise the mma.sync loop with the deepest KV pipeline that fits shared memory per block."""
    if wgmma_fits(spec, arch):
        return WgmmaTiles()
    base = dict(bm=32, bn=32, warps_m=2)
    for stages in (4, 3, 2):
        t = AttentionTiles(stages=stages, **base)
        if _fits(arch, attention_smem_bytes(spec, t)):
            return t
    t = AttentionTiles(stages=2, **base)
    need = attention_smem_bytes(spec, t)
    raise PlanError(
        f"{spec.name}: attention needs {need} B of shared memory per block with the smallest "
        f"tiles (BM={t.bm}, BN={t.bn}, 2 stages) but {arch.name} allows {arch.smem_per_block} B "
        f"(over by {need - arch.smem_per_block} B)"
    )


def _tag(spec: Spec, arch: Arch) -> str:
    m, c = spec.model, spec.cache
    dtype = {"bf16": "bf16", "f16": "e4m3f16", "e4m3": "e4m3"}[c.mma_type]  # KV type, and MMA type if other
    tree = f"st{spec.tree.nodes}" if spec.tree.is_static else f"t{spec.tree.nodes}"
    return f"h{m.num_q_heads}_d{m.head_dim}_ps{c.page_size}_{dtype}_{tree}_{arch.name.replace('_', '')}"


def _p(decl: str) -> Param:
    ctype, name = decl.rsplit(" ", 1)
    return Param(name, ctype)


def _params(*decls: str) -> tuple[Param, ...]:
    return tuple(_p(d) for d in decls)


BF16 = "__nv_bfloat16"


def _attention_constants(spec: Spec, t: Tiles) -> dict[str, object]:
    return {
        "HEADS": spec.model.num_q_heads,
        "DESIGN_HEADER": t.header,
        "CONFIG": t.config(spec),
        "SCALE_LOG2": spec.model.softmax_scale * LOG2E,
    }


@dataclass(frozen=True)
class PlanContext:
    """What every kernel entry plans from: the spec, the arch, the attention tiling, the id tag."""

    spec: Spec
    arch: Arch
    tiles: Tiles
    tag: str

    @property
    def attention_smem(self) -> int:
        return attention_smem_bytes(self.spec, self.tiles)

    @property
    def tree_constants(self) -> dict[str, object]:
        tree = self.spec.tree
        consts: dict[str, object] = {"MASK_WORDS": tree.mask_words, "STATIC_TREE": int(tree.is_static)}
        if tree.is_static:
            from .mask import static_mask_words  # local: plan -> mask is only needed for static trees
            consts["STATIC_MASK"] = static_mask_words(tree.parents)
        return consts

    def attention(self, name: str, template: str, constants: dict[str, object], params: tuple[str, ...]) -> Variant:
        """An attention variant: the tiling's threads, shared memory, features and SASS expectations."""
        t = self.tiles
        return Variant(kernel="tree_attn" if name == "tree_attn" else "prefix_attn", name=name, template=template,
                       threads=t.threads, smem_bytes=self.attention_smem, min_blocks=t.min_blocks,
                       constants={**_attention_constants(self.spec, t), **constants}, params=_params(*params),
                       tag=self.tag, requires=t.requires, sass_expect=t.sass_expect)


# ---- the kernels: one entry each (template, typed parameters, constants, launch shape) ----------

# Every attention CTA finds its own split-KV work item (templates/schedule.cuh).
SCHEDULE_PARAMS = ("const int* __restrict__ qo_indptr", "const int* __restrict__ kv_lens", "int batch",
                   "int target_ctas", "int min_split_tiles", "int min_splits", "int max_nodes", "int total_tokens",
                   "int validate", "int* __restrict__ error_flag", "int4* __restrict__ req_meta")


def _lse_merge(c: PlanContext) -> list[Variant]:
    """merge_states of bf16 or fp32 states (templates/merge.cuh)."""
    return [Variant(kernel="lse_merge", name=f"lse_merge_{dtype}", template="lse_merge.cu.j2",
                    threads=256, smem_bytes=0, min_blocks=4, constants={"T": ctype, "VEC": 8},
                    params=_params(f"const {ctype}* __restrict__ o_a", "const float* __restrict__ lse_a",
                                   f"const {ctype}* __restrict__ o_b", "const float* __restrict__ lse_b",
                                   f"{ctype}* __restrict__ o", "float* __restrict__ lse", "long long rows",
                                   "int width"),
                    tag=c.tag)
            for dtype, ctype in (("bf16", BF16), ("f32", "float"))]


def _kv_defrag(c: PlanContext) -> list[Variant]:
    """Moves KV rows between slots in every layer (templates/defrag.cuh)."""
    return [Variant(kernel="kv_defrag", name="kv_defrag", template="kv_defrag.cu.j2",
                    threads=256, smem_bytes=0, min_blocks=4, constants={},
                    params=_params("const long long* __restrict__ layers", "const long long* __restrict__ src",
                                   "const long long* __restrict__ dst", "const unsigned char* __restrict__ is_dst",
                                   "uint4* __restrict__ staging", "long long n", "int num_layers", "int row_chunks",
                                   "int phase"),
                    tag=c.tag)]


def _prefix_attn(c: PlanContext) -> list[Variant]:
    """prefix_attn and verify_attn (the latter also takes each request's tree in its last split)."""
    kv = KV_CTYPES[c.spec.cache.kv_dtype]
    prefix = (f"const {BF16}* __restrict__ q", f"const {kv}* __restrict__ kv_cache", "float kv_scale",
              "const int* __restrict__ kv_indptr", "const int* __restrict__ kv_indices", *SCHEDULE_PARAMS,
              "float* __restrict__ part_o", "float* __restrict__ part_lse", "long long num_slots")
    tree = (f"const {kv}* __restrict__ k_tree", "const int* __restrict__ tree_mask")
    return [c.attention(name, "prefix_attn.cu.j2",
                        {"PAGE_SIZE": c.spec.cache.page_size, "FUSE_TREE": fuse, **(c.tree_constants if fuse else {})},
                        (*prefix, *(tree if fuse else ())))
            for name, fuse in (("prefix_attn", False), ("verify_attn", True))]


def _tree_attn(c: PlanContext) -> list[Variant]:
    """A request's tree tokens against each other under the mask."""
    kv = KV_CTYPES[c.spec.cache.kv_dtype]
    return [c.attention("tree_attn", "tree_attn.cu.j2", c.tree_constants,
                        (f"const {BF16}* __restrict__ q", f"const {kv}* __restrict__ k_tree", "float kv_scale",
                         "const int* __restrict__ tree_mask", *SCHEDULE_PARAMS, "float* __restrict__ part_o",
                         "float* __restrict__ part_lse"))]


def combine_variant(c: PlanContext, name: str, bm: int) -> Variant:
    """Merges an attention call's split partials (bm rows each) into o and lse."""
    m = c.spec.model
    return Variant(kernel="lse_merge", name=name, template="lse_combine.cu.j2",
                   threads=m.value_dim // 4, smem_bytes=0, min_blocks=4,
                   constants={"HEADS": m.num_q_heads, "DV": m.value_dim, "BM": bm},
                   params=_params("const float* __restrict__ part_o", "const float* __restrict__ part_lse",
                                  "const int* __restrict__ qo_indptr", "const int4* __restrict__ req_meta",
                                  "int batch", f"{BF16}* __restrict__ o", "float* __restrict__ lse"),
                   tag=c.tag)


def _lse_combine(c: PlanContext) -> list[Variant]:
    return [combine_variant(c, "lse_combine", c.tiles.bm)]


def _sparse(c: PlanContext) -> list[Variant]:
    """The sparse (DSA) kernels of a spec with model.index_topk (kgen/sparse_plan.py)."""
    from .sparse_plan import sparse_variants  # local: sparse_plan builds on this module

    return sparse_variants(c)


# The registry, in the order of a plan's variants (and generated/ manifests). Adding a kernel is an
# entry here and a template; the ops find its variants by name.
KERNELS = (_lse_merge, _kv_defrag, _prefix_attn, _tree_attn, _lse_combine, _sparse)


def plan(spec: Spec, arch: str | Arch | None = None, tiles: Tiles | None = None) -> Plan:
    """Plan every kernel of `spec` for `arch` (default: the spec's target). `tiles` overrides the
    attention tiling (for tuning); it is still checked against the arch's limits."""
    arch = get_arch(arch or spec.target.arch) if not isinstance(arch, Arch) else arch
    tiles = tiles or choose_attention_tiles(spec, arch)
    missing = [f for f in tiles.requires if f not in arch.features]
    if missing:
        raise PlanError(f"{spec.name}: the {tiles.design} loop needs {', '.join(missing)}, which {arch.name} lacks")
    ctx = PlanContext(spec, arch, tiles, _tag(spec, arch))
    smem = ctx.attention_smem
    if arch.smem_per_sm // (smem + arch.smem_reserved_per_block) < tiles.min_blocks:
        raise PlanError(f"{spec.name}: {tiles.min_blocks} attention CTAs per SM need "
                        f"{tiles.min_blocks * (smem + arch.smem_reserved_per_block)} B of shared memory; "
                        f"{arch.name} has {arch.smem_per_sm} B per SM")
    variants = [v for entry in KERNELS for v in entry(ctx)]
    for v in variants:
        if v.smem_bytes > arch.smem_per_block:
            raise PlanError(
                f"{spec.name}: {v.name} needs {v.smem_bytes} B of shared memory per block; "
                f"{arch.name} allows {arch.smem_per_block} B (over by {v.smem_bytes - arch.smem_per_block} B)"
            )
        warps = v.threads // 32
        if warps * v.min_blocks > arch.max_warps_per_sm:
            raise PlanError(f"{spec.name}: {v.name} wants {warps * v.min_blocks} warps per SM; "
                            f"{arch.name} has {arch.max_warps_per_sm}")

    budget = {"smem_per_block": arch.smem_per_block, "attention_smem": smem,
              "attention_smem_headroom": arch.smem_per_block - smem}
    return Plan(spec=spec, arch=arch, tiles=tiles, variants=tuple(variants), budget=budget)


MIN_SPLIT_TILES = 4  # a split reads at least 4 KV tiles, so partial states stay a small overhead


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def work_capacity(plan: Plan, total_tokens: int, batch: int, target_ctas: int) -> tuple[int, int]:
    """Upper bounds, known on the host, of the schedule's work items (templates/schedule.cuh): the
    attention grid of a call with a prefix, and of a tree-only call (one item per row tile).

    The schedule picks a split of ceil(W / target) tiles, so prefix items number at most
    target + sum_b mtiles_b, and sum_b mtiles_b <= ceil(total_tokens * H / BM) + batch.
    """
    mtiles = ceil_div(total_tokens * plan.spec.model.num_q_heads, plan.tiles.bm) + batch
    return target_ctas + mtiles, mtiles

