"""The kernel registry: every kernel of a plan, how it is planned (template, typed parameters,
constants, launch shape), what its grid is, how its argument block is assembled, and the op that
launches it. Adding a kernel is an entry here and a template; ops and steps launch entries,
never kernel names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import designs, kvrows, sparse_plan
from .splitkv import MIN_SPLIT_TILES, Capacity, ceil_div
from .variant import BF16, PlanContext, Variant, params


@dataclass(frozen=True)
class KernelEntry:
    name: str  # Variant.kernel of its variants
    op: str  # the Module method (and torch.ops.kgen op) that launches it
    planner: Callable[[PlanContext], list[Variant]] | None = None

    def variants(self, c: PlanContext) -> list[Variant]:
        """The entry's variants in a plan."""
        return self.planner(c)


# ---- attention: one entry per half of a verify call, and verify itself --------------------------

# The split-KV schedule's inputs (templates/schedule.cuh): an attention CTA takes its work item from
# a prepared step's schedule table (split_table; 0: none) or finds it for itself.
SPLIT_PARAMS = ("const int* __restrict__ qo_indptr", "const int* __restrict__ kv_lens", "int batch",
                "int target_ctas", "int min_split_tiles", "int min_splits", "int max_nodes", "int total_tokens")
# The KV cache as a tensor map (kgen/tilemap.py): the last parameter of the kernels that copy whole tiles.
TILE_MAP_PARAM = "const __grid_constant__ kgen::TileMap kv_map"
SCHEDULE_PARAMS = (*SPLIT_PARAMS, "int validate", "int* __restrict__ error_flag", "int4* __restrict__ req_meta",
                   "const int* __restrict__ split_table")


@dataclass(frozen=True)
class AttentionEntry(KernelEntry):
    """An attention kernel: which halves of a step it reads, its grid and its argument block."""

    prefix: bool = False  # reads the paged prefix: kv_cache, kv_indptr, kv_indices, kv_lens
    tree: bool = False  # reads the tree tokens: k_tree, tree_mask

    def grid(self, capacity: Capacity) -> int:
        """One CTA per work item the schedule can hand out (splitkv.work_capacity); CTAs past
        the last item return at once."""
        return capacity.prefix if self.prefix else capacity.tree

    def step_args(self, step) -> dict[str, object]:
        """The argument block but the per-layer values (q, kv_cache, num_slots, k_tree, kv_scale),
        from a prepared step (kgen/step.py). A call with the tree gives every request at least one
        split: verify's tree rides on each row tile's last split, tree-only has one item per row
        tile (every kv_len 0); a tree-only call reads zero prefix lengths."""
        args = dict(q=None, kv_scale=1.0, **self.split_args(step), validate=int(step.validate),
                    error_flag=step.error_flag, req_meta=step.req_meta, split_table=step.split_table(self),
                    part_o=step.part_o, part_lse=step.part_lse)
        if self.prefix:
            args.update(kv_cache=None, kv_indptr=step.kv_indptr, kv_indices=step.kv_indices, num_slots=0)
        if self.tree:
            args.update(k_tree=None, tree_mask=step.tree_mask)
        return args

    def split_args(self, step) -> dict[str, object]:
        """The schedule's inputs (SPLIT_PARAMS) for this kernel in a prepared step: a tree-only call
        reads zero prefix lengths."""
        return dict(qo_indptr=step.qo_indptr, kv_lens=step.kv_lens if self.prefix else step.zero_lens,
                    batch=step.batch, target_ctas=step.target_ctas, min_split_tiles=MIN_SPLIT_TILES,
                    min_splits=int(self.tree), max_nodes=step.max_nodes if self.tree else step.num_tokens,
                    total_tokens=step.num_tokens)

    def variants(self, c: PlanContext) -> list[Variant]:
        kv = kvrows.ctype(c.spec)
        q, out = f"const {BF16}* __restrict__ q", ("float* __restrict__ part_o", "float* __restrict__ part_lse")
        k_tree, mask = f"const {kv}* __restrict__ k_tree", "const int* __restrict__ tree_mask"
        if not self.prefix:  # tree_attn: a request's tree tokens against each other under the mask
            decls = (q, k_tree, "float kv_scale", mask, *SCHEDULE_PARAMS, *out)
            return [c.attention(self.name, "tree_attn.cu.j2", c.tree_constants, decls)]
        # prefix_attn, and verify_attn (which also takes each request's tree in its last split); a
        # design that copies whole tiles gets the cache as a tensor map too (kv_map, per layer)
        box = designs.of(c.tiles).tile_box(c.spec, c.tiles)
        decls = (q, f"const {kv}* __restrict__ kv_cache", "float kv_scale", "const int* __restrict__ kv_indptr",
                 "const int* __restrict__ kv_indices", *SCHEDULE_PARAMS, *out, "long long num_slots",
                 *((k_tree, mask) if self.tree else ()), *((TILE_MAP_PARAM,) if box else ()))
        constants = {"PAGE_SIZE": c.spec.cache.page_size, "FUSE_TREE": self.tree,
                     "TILE_MAP_ROWS": box.rows if box else 0,
                     **({"TILE_MAP_BOX": box.box_bytes, "TILE_MAP_SWIZZLE": int(box.swizzle128)} if box else {}),
                     **(c.tree_constants if self.tree else {})}
        return [c.attention(self.name, "prefix_attn.cu.j2", constants, decls)]


# ---- the schedule table of a prepared step: one launch per step and attention kernel -----------

SCHEDULE_THREADS = 128  # split_schedule's CTA: requests are scanned blockDim.x at a time


@dataclass(frozen=True)
class ScheduleEntry(KernelEntry):
    @staticmethod
    def step_args(step, attention: AttentionEntry) -> dict[str, object]:
        """split_schedule's argument block for one attention kernel of a prepared step."""
        return dict(**attention.split_args(step), error_flag=step.error_flag, table=step.split_table(attention))


def _split_schedule(c: PlanContext) -> list[Variant]:
    return [Variant(kernel="split_schedule", name="split_schedule", template="split_schedule.cu.j2",
                    threads=SCHEDULE_THREADS, smem_bytes=0, min_blocks=1,
                    constants={"HEADS": c.spec.model.num_q_heads, "BM": c.tiles.bm, "BN": c.tiles.bn,
                               "CLUSTER": c.tiles.cluster},
                    params=params(*SPLIT_PARAMS, "int* __restrict__ error_flag", "int* __restrict__ table"),
                    tag=c.tag)]


SCHEDULE = ScheduleEntry("split_schedule", "Module.prepare (a prepared step's first call of each kernel, "
                         "Step.reschedule)", _split_schedule)


PREFIX = AttentionEntry("prefix_attn", "prefix_attention", prefix=True)
VERIFY = AttentionEntry("verify_attn", "verify_attention", prefix=True, tree=True)
TREE = AttentionEntry("tree_attn", "tree_attention", tree=True)


# ---- the combine: an attention call's second launch ----------------------------------------------

# templates/merge.cuh's combine: a group of value_dim / 4 threads per STATE_BATCH states in flight
# a row, at most MAX_GROUPS groups a CTA.
COMBINE_MAX_GROUPS, COMBINE_STATE_BATCH = 8, 4


@dataclass(frozen=True)
class CombineEntry(KernelEntry):
    def grid(self, rows: int) -> int:
        """One CTA per output row (token, head): it merges that row's split partial states."""
        return rows

    @staticmethod
    def threads(value_dim: int, rows: int, items: int, bm: int, batch: int, sm_count: int) -> int:
        """Threads of a combine CTA: enough groups to hold a row's states in flight at once, while
        every row's CTA still runs in one wave (an SM holds 1024 of its threads: its launch bounds).
        A row has at most ~items x (real rows of an item) / rows states, where an item's real rows
        are its row tile's, at most the tokens x heads of an average request (decode fills 8 of 64)."""
        item_rows = min(bm, ceil_div(rows, max(1, batch)))
        states = ceil_div(items * item_rows, max(1, rows))
        cols, groups = value_dim // 4, 1
        while (groups < COMBINE_MAX_GROUPS and groups * COMBINE_STATE_BATCH < states
               and rows * cols * groups * 2 <= sm_count * 1024):
            groups *= 2
        return cols * groups

    def step_args(self, step) -> dict[str, object]:
        """The argument block but the outputs (o, lse: per layer call)."""
        return dict(part_o=step.part_o, part_lse=step.part_lse, qo_indptr=step.qo_indptr, req_meta=step.req_meta,
                    batch=step.batch, o=None, lse=None)


def combine_variant(c: PlanContext, name: str, bm: int, overlaps_attention: bool, part_o: str = "float") -> Variant:
    """Merges an attention call's split partials (bm rows each, o of type part_o) into o and lse;
    launched with CombineEntry.threads (at most the variant's), and to overlap the attention
    kernel's tail where `overlaps_attention` (programmatic dependent launch: bench/NOTES.md v29
    says where it pays)."""
    m = c.spec.model
    return Variant(kernel=name, name=name, template="lse_combine.cu.j2",
                   threads=m.value_dim // 4 * COMBINE_MAX_GROUPS, smem_bytes=0, min_blocks=1,
                   constants={"HEADS": m.num_q_heads, "DV": m.value_dim, "BM": bm,
                              "MAX_GROUPS": COMBINE_MAX_GROUPS, "STATE_BATCH": COMBINE_STATE_BATCH},
                   params=params(f"const {part_o}* __restrict__ part_o", "const float* __restrict__ part_lse",
                                 "const int* __restrict__ qo_indptr", "const int4* __restrict__ req_meta",
                                 "int batch", f"{BF16}* __restrict__ o", "float* __restrict__ lse"),
                   tag=c.tag, waits_for_prior=overlaps_attention)


def _lse_combine(c: PlanContext) -> list[Variant]:
    return [combine_variant(c, "lse_combine", c.tiles.bm, overlaps_attention=False)]


COMBINE = CombineEntry("lse_combine", "verify_attention, prefix_attention, tree_attention", _lse_combine)


# ---- sparse (DSA) verify: specs with model.index_topk (kgen/sparse_plan.py, kgen/sparse.py) --------

def _sparse_attn(c: PlanContext) -> list[Variant]:
    return sparse_plan.sparse_variants(c)


def _sparse_combine(c: PlanContext) -> list[Variant]:
    if not c.spec.model.sparse:
        return []
    return [combine_variant(c, "sparse_combine", sparse_plan.sparse_bm(c), overlaps_attention=True,
                            part_o=sparse_plan.PART_O)]


def _sparse_schedule(c: PlanContext) -> list[Variant]:
    """A prepared sparse step's schedule table (templates/sparse_schedule.cuh) for either sparse
    kernel: one CTA per work item slot."""
    if not c.spec.model.sparse:
        return []
    return [Variant(kernel="sparse_schedule", name="sparse_schedule", template="sparse_schedule.cu.j2",
                    threads=SCHEDULE_THREADS, smem_bytes=0, min_blocks=1,
                    constants={"HEADS": c.spec.model.num_q_heads, "BM": sparse_plan.sparse_bm(c)},
                    params=params("const int* __restrict__ qo_indptr", *sparse_plan.SCHEDULE_PARAMS,
                                  "int* __restrict__ table"),
                    tag=c.tag)]


# The sparse step (kgen/sparse.py) packs their argument blocks.
SPARSE = KernelEntry("sparse_attn", "sparse_verify_attention", _sparse_attn)
SPARSE_SCHEDULE = KernelEntry("sparse_schedule", "prepare_sparse (a prepared sparse step's first call, "
                              "SparseStep.reschedule)", _sparse_schedule)
SPARSE_COMBINE = CombineEntry("sparse_combine", "sparse_verify_attention", _sparse_combine)


# ---- merge_states and defrag: grid-stride kernels --------------------------------------------------

MERGE_CTAS_PER_SM = 16  # a grid-stride loop: at most a few waves of CTAs, each then strides on
DEFRAG_CTAS_PER_SM = 8


@dataclass(frozen=True)
class GridStrideEntry(KernelEntry):
    ctas_per_sm: int = 1

    def grid(self, work: int, threads: int, sm_count: int) -> int:
        """One thread per unit of `work` (an 8-wide vector, a 16-byte chunk), at most ctas_per_sm
        CTAs per SM: the kernel loops over the rest."""
        return min(ceil_div(work, threads), sm_count * self.ctas_per_sm)


def _lse_merge(c: PlanContext) -> list[Variant]:
    """merge_states of bf16 or fp32 states (templates/merge.cuh)."""
    return [Variant(kernel="lse_merge", name=f"lse_merge_{dtype}", template="lse_merge.cu.j2",
                    threads=256, smem_bytes=0, min_blocks=4, constants={"T": ctype, "VEC": 8},
                    params=params(f"const {ctype}* __restrict__ o_a", "const float* __restrict__ lse_a",
                                  f"const {ctype}* __restrict__ o_b", "const float* __restrict__ lse_b",
                                  f"{ctype}* __restrict__ o", "float* __restrict__ lse", "long long rows",
                                  "int width"),
                    tag=c.tag)
            for dtype, ctype in (("bf16", BF16), ("f32", "float"))]


def _kv_defrag(c: PlanContext) -> list[Variant]:
    """Moves KV rows between slots in every layer (templates/defrag.cuh)."""
    return [Variant(kernel="kv_defrag", name="kv_defrag", template="kv_defrag.cu.j2",
                    threads=256, smem_bytes=0, min_blocks=4, constants={},
                    params=params("const long long* __restrict__ layers", "const long long* __restrict__ src",
                                  "const long long* __restrict__ dst", "const unsigned char* __restrict__ is_dst",
                                  "uint4* __restrict__ staging", "long long n", "int num_layers", "int row_chunks",
                                  "int phase"),
                    tag=c.tag)]


MERGE = GridStrideEntry("lse_merge", "merge_states", _lse_merge, ctas_per_sm=MERGE_CTAS_PER_SM)
DEFRAG = GridStrideEntry("kv_defrag", "defrag", _kv_defrag, ctas_per_sm=DEFRAG_CTAS_PER_SM)

# The registry, in the order of a plan's variants (and generated/ manifests).
ENTRIES: tuple[KernelEntry, ...] = (MERGE, DEFRAG, SCHEDULE, PREFIX, VERIFY, TREE, COMBINE, SPARSE, SPARSE_SCHEDULE,
                                     SPARSE_COMBINE)
