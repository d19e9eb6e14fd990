"""Prepared steps (DESIGN §5): one batch's attention, checked, sized and packed once, run per layer.

A server runs attention once per layer with the same batch metadata. Module.prepare checks the
metadata tensors, sizes the grids, allocates the scratch and packs each kernel's parameter block
once; a layer call (verify, prefix, tree) checks only its own tensors, writes their addresses
into the blocks and launches two kernels (attention, combine). Nothing else is allocated but the
outputs the caller did not pass, nothing is converted, nothing waits for the GPU.

A step keeps the metadata tensors' addresses and sizes, never their values (it reads nothing
back), so between calls and between CUDA-graph replays the caller may refill them in place with
any batch that fits:
- the same B requests and num_tokens tree tokens (qo_indptr[B] = num_tokens), split among the
  requests in any way, at most max_nodes per request for verify and tree;
- any prefix lengths and pages, as long as kv_indptr[B] <= kv_indices.numel() and every page
  lies inside the layer's kv_cache;
- any tree masks.
Fixed for a step's life: the metadata tensors themselves (storage and shapes), B, num_tokens
and KGEN_VALIDATE (read at prepare).

The split-KV schedule (which CTA attends which rows over which keys) is written once into a
schedule table per kernel, by a launch of its own on the kernel's first call (Step.reschedule()
writes it again). An attention CTA reads its work item from the table when the table was made
from the call's lengths and finds it for itself (~3 us more per call) when they were refilled
since: a caller that refills them calls reschedule() once after, before the layers (a CUDA-graph
replay: before the replay, or inside the graph before the first layer).

A captured graph also keeps each call's q, kv_cache, k_tree, out, lse and kv_scale. Steps that
share a workspace must run in turn on one stream, and one step serves one thread at a time (a
call rewrites its parameter blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checks, env, kvrows, tilemap
from .choice import PlanChoice
from .device import DeviceState
from .kernels import COMBINE, PREFIX, SCHEDULE, TREE, VERIFY, AttentionEntry
from .kvargs import KVArgs
from .loading import LoadedPlans
from .plan import Plan
from .spec import Spec
from .splitkv import table_bytes

_ALIGN = 256  # bytes: every scratch array of a workspace starts aligned (float4 / int4 accesses)
_BF16 = (torch.bfloat16,)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


_TABLES = (VERIFY, PREFIX, TREE)  # a schedule table each (their schedules differ)


@dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets of a step's scratch arrays in its workspace (part_o starts it), and its size."""

    part_lse: int
    req_meta: int
    tables: int  # the first schedule table; each is table_bytes long, aligned
    size: int


def workspace_layout(plan: Plan, grid: int, batch: int) -> WorkspaceLayout:
    """The workspace of `grid` attention CTAs of `plan` (one partial state of BM rows each) and
    `batch` requests."""
    rows = grid * plan.tiles.bm
    part_lse = _aligned(rows * plan.spec.model.value_dim * 4)
    req_meta = part_lse + _aligned(rows * 4)
    tables = req_meta + _aligned(batch * 16)
    return WorkspaceLayout(part_lse, req_meta, tables, tables + len(_TABLES) * _aligned(table_bytes(grid, batch)))


@dataclass(frozen=True)
class StepContext:
    """What a step runs with: the module's spec, loaded plans, plan choice and device state."""

    spec: Spec
    loaded: LoadedPlans
    choice: PlanChoice
    device: DeviceState

    def target_ctas(self, plan: Plan) -> int:
        return self.loaded.target.sm_count * plan.tiles.min_blocks  # one wave of attention CTAs

    def workspace_bytes(self, num_tokens: int, batch: int) -> int:
        """Scratch bytes of a step (whichever of the tilings its bucket runs)."""
        return max(workspace_layout(p, p.capacity(num_tokens, batch, self.target_ctas(p)).prefix, batch).size
                   for p in self.loaded.plans.values())


class Step:
    """One batch, prepared by Module.prepare; run a layer with verify(), prefix() or tree()."""

    def __init__(self, ctx: StepContext, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, num_tokens,
                 workspace, schedule_table: bool = True):
        spec, dev = ctx.spec, ctx.device.device
        self._ctx, self._device = ctx, dev
        self.qo_indptr = checks.indptr("qo_indptr", qo_indptr, length=None, device=dev)
        self.batch = batch = self.qo_indptr.numel() - 1
        self._no_prefix = self._no_tree = None  # why prefix kernels / tree kernels cannot run, if they cannot
        if kv_indptr is None and kv_indices is None and kv_lens is None:
            self._no_prefix = "kv_indptr/kv_indices/kv_lens: this step was prepared without a prefix"
        else:
            self.kv_indptr = checks.indptr("kv_indptr", kv_indptr, length=batch + 1, device=dev)
            self.kv_indices = checks.tensor("kv_indices", kv_indices, dtype=torch.int32, device=dev, ndim=1)
            self.kv_lens = checks.tensor("kv_lens", kv_lens, dtype=torch.int32, device=dev, shape=(batch,))
        if num_tokens is not None and (not isinstance(num_tokens, int) or num_tokens < 0):
            raise TypeError(f"num_tokens: expected an int >= 0 (the rows of q), got {num_tokens!r}")
        self.num_tokens = self._check_tree(spec, tree_mask, num_tokens)
        self.max_nodes = spec.tree.nodes

        self.validate = env.flag("KGEN_VALIDATE")
        self.error_flag = ctx.device.error_flag
        # The tiling of this batch's bucket (a tuned table's choice, else the heuristic plan fitted to it).
        context = 0 if self._no_prefix else self.kv_indices.numel() * spec.cache.page_size
        tiles = ctx.choice.tiles_for(self.num_tokens, batch, context, spec.model.num_q_heads)
        self.plan, self._kernels = ctx.loaded.plans[tiles], ctx.loaded.kernels[tiles]
        self.target_ctas = ctx.target_ctas(self.plan)
        self._capacity = self.plan.capacity(self.num_tokens, batch, self.target_ctas)
        self._empty = self.num_tokens == 0 or batch == 0
        items = TREE.grid(self._capacity) if self._no_prefix else PREFIX.grid(self._capacity)
        self.workspace = self._check_workspace(workspace, items)
        # One-shot ops (one call) and KGEN_VALIDATE calls (whose CTAs check the lengths) have none.
        self._schedule_table = schedule_table and not self.validate
        self._schedules: dict[AttentionEntry, object] = {}  # entry -> split_schedule's parameter block
        self._unscheduled: set[AttentionEntry] = set()  # packed, its table not yet written

        m = spec.model
        self._q_shape = (self.num_tokens, m.num_q_heads, m.head_dim)
        self._out_shape = (self.num_tokens, m.num_q_heads, m.value_dim)
        self._lse_shape = (self.num_tokens, m.num_q_heads)
        self._kv = KVArgs(spec, dev)
        combine = self._kernels[COMBINE.name]
        rows = self.num_tokens * m.num_q_heads
        threads = COMBINE.threads(m.value_dim, rows, items, self.plan.tiles.bm, batch, ctx.loaded.target.sm_count)
        self._combine = (combine, COMBINE.grid(rows), threads, combine.layout.pack(**COMBINE.step_args(self)))
        self._launches: dict[AttentionEntry, tuple] = {}  # entry -> (kernel, grid, parameter block), on first use
        self._map_boxes: dict[AttentionEntry, tuple[int, int, int, bool]] = {}  # entry -> its tensor maps' box

    def _check_tree(self, spec, tree_mask, num_tokens: int | None) -> int:
        """The step's token count; checks tree_mask and notes when tree kernels cannot run."""
        tree, batch = spec.tree, self.batch
        self.tree_mask = tree_mask
        if tree.is_static:
            if tree_mask is not None:
                raise ValueError(f"tree_mask: spec {spec.name} has a static tree compiled in; pass None")
            tokens = batch * tree.nodes if num_tokens is None else num_tokens
            if tokens != batch * tree.nodes:
                self._no_tree = (f"q: a static tree of {tree.nodes} nodes needs {batch} x {tree.nodes} tokens, "
                                 f"got {tokens}")
            return tokens
        if tree_mask is None:
            if num_tokens is None:
                raise ValueError("num_tokens: a step without a tree mask needs num_tokens (the rows of q)")
            self._no_tree = "tree_mask: this step was prepared without a tree mask"
            return num_tokens
        if isinstance(tree_mask, torch.Tensor) and tree_mask.dim() == 2 and tree_mask.shape[1] < tree.mask_words:
            raise ValueError(f"tree_mask: {tree_mask.shape[1]} int32 words per row are narrower than max_nodes "
                             f"{tree.nodes} needs ({tree.mask_words})")
        self.tree_mask = checks.tensor("tree_mask", tree_mask, dtype=torch.int32, device=self._device,
                                       shape=(num_tokens, tree.mask_words))
        return self.tree_mask.shape[0]

    def _check_workspace(self, workspace, grid: int) -> torch.Tensor:
        """The caller's workspace, checked, or a new one; sets the scratch arrays' addresses."""
        layout = workspace_layout(self.plan, grid, self.batch)
        if workspace is None:
            workspace = torch.empty(0 if self._empty else layout.size, dtype=torch.uint8, device=self._device)
        else:
            workspace = checks.tensor("workspace", workspace, dtype=torch.uint8, device=self._device, ndim=1)
            if workspace.numel() < layout.size:
                raise ValueError(f"workspace: this step needs {layout.size} bytes (Module.workspace_bytes), "
                                 f"got {workspace.numel()}")
        base = workspace.data_ptr()
        self.part_o, self.part_lse, self.req_meta = base, base + layout.part_lse, base + layout.req_meta
        table = _aligned(table_bytes(grid, self.batch))
        self._tables = {e: base + layout.tables + i * table for i, e in enumerate(_TABLES)}
        return workspace

    def split_table(self, entry: AttentionEntry) -> int:
        """The address of `entry`'s schedule table, or 0 where the step keeps none."""
        return self._tables[entry] if self._schedule_table else 0

    def reschedule(self) -> None:
        """Write the schedule tables of the kernels this step has run again, from the lengths the
        metadata tensors hold now (one launch each, on the current stream): after refilling them
        in place, so that the next calls read their work items rather than find them."""
        if self._empty:
            return
        stream = self._ctx.device.stream()
        for entry in self._schedules:
            self._write_table(entry, stream)

    def _write_table(self, entry: AttentionEntry, stream) -> None:
        self._kernels[SCHEDULE.name].launch(entry.grid(self._capacity), self._schedules[entry], stream)
        self._unscheduled.discard(entry)

    # ---- per layer ------------------------------------------------------------------------

    def verify(self, q, kv_cache, k_tree, *, kv_scale=1.0, out=None, lse=None):
        """Attention of the batch's tree tokens over their prefixes and trees: (out, lse)."""
        return self._run(VERIFY, q, kv_cache, k_tree, kv_scale, out, lse)

    def prefix(self, q, kv_cache, *, kv_scale=1.0, out=None, lse=None):
        """Attention of the batch's tree tokens over their paged prefixes only."""
        return self._run(PREFIX, q, kv_cache, None, kv_scale, out, lse)

    def tree(self, q, k_tree, *, kv_scale=1.0, out=None, lse=None):
        """Attention of the batch's tree tokens over each other under the tree mask only."""
        return self._run(TREE, q, None, k_tree, kv_scale, out, lse)

    def _run(self, entry: AttentionEntry, q, kv_cache, k_tree, kv_scale, out, lse):
        kernel, grid, block = self._launches.get(entry) or self._build(entry)
        dev, v = self._device, block.values
        v.kv_scale = kv_scale = self._kv.scale(kv_scale)
        v.q = checks.address("q", q, dtypes=_BF16, device=dev, shape=self._q_shape)
        if entry.prefix:
            v.kv_cache, v.num_slots = self._kv.cache(kv_cache)
            if entry in self._map_boxes:  # the layer's cache as a tensor map (made once per cache)
                v.kv_map = self._ctx.device.tile_maps.get(v.kv_cache, v.num_slots, *self._map_boxes[entry])
        if entry.tree:
            v.k_tree, k_tree = self._kv.tree(k_tree, self.num_tokens, kv_scale)  # held until the launch
        combine, combine_grid, combine_threads, combine_block = self._combine
        if out is None:
            out = torch.empty(self._out_shape, dtype=torch.bfloat16, device=dev)
        if lse is None:
            lse = torch.empty(self._lse_shape, dtype=torch.float32, device=dev)
        c = combine_block.values
        c.o = checks.address("out", out, dtypes=_BF16, device=dev, shape=self._out_shape)
        c.lse = checks.address("lse", lse, dtypes=(torch.float32,), device=dev, shape=self._lse_shape)
        if self._empty:
            return out, lse
        if self.validate:
            self.error_flag.zero_()
        stream = self._ctx.device.stream()
        if entry in self._unscheduled:  # the kernel's first call: its table first
            self._write_table(entry, stream)
        kernel.launch(grid, block, stream)
        combine.launch(combine_grid, combine_block, stream, combine_threads)
        if self.validate:
            self._raise_device_errors(entry.prefix)
        return out, lse

    def _build(self, entry: AttentionEntry) -> tuple:
        """Pack the entry's parameter block: everything but the per-layer tensors and kv_scale."""
        if entry.prefix and self._no_prefix:
            raise ValueError(self._no_prefix)
        if entry.tree and self._no_tree:
            raise ValueError(self._no_tree)
        if not entry.prefix:
            self.zero_lens = self._ctx.device.zero_lens(self.batch)  # held: the block points at it
        kernel = self._kernels[entry.name]
        args = entry.step_args(self)
        rows = kernel.variant.constants.get("TILE_MAP_ROWS", 0)
        if rows:  # (row bytes, box bytes, box rows, swizzled) of its tensor maps
            k = kernel.variant.constants
            self._map_boxes[entry] = (kvrows.row_bytes(self._ctx.spec), k["TILE_MAP_BOX"], rows,
                                      bool(k["TILE_MAP_SWIZZLE"]))
            args["kv_map"] = tilemap.EMPTY
        launch = self._launches[entry] = (kernel, entry.grid(self._capacity), kernel.layout.pack(**args))
        if self._schedule_table:
            self._schedules[entry] = self._kernels[SCHEDULE.name].layout.pack(**SCHEDULE.step_args(self, entry))
            self._unscheduled.add(entry)
        return launch

    def _raise_device_errors(self, has_prefix: bool) -> None:
        flag = int(self.error_flag.item())  # KGEN_VALIDATE=1 is a debug mode: the sync is expected
        if flag & 1:
            raise ValueError("qo_indptr/kv_lens: a request has a negative length, more tree tokens than the spec's "
                             "max_nodes, or qo_indptr does not run from 0 to the number of tokens (KGEN_VALIDATE)")
        if flag & 2 and has_prefix:
            raise ValueError("kv_indices/kv_lens: a prefix token maps outside its request's pages or outside "
                             "kv_cache (KGEN_VALIDATE)")
