"""Sparse (DSA) tree verify (DESIGN §12): prepared steps over top-k index lists.

`step = mod.prepare_sparse(qo_indptr, topk_indices, tree_mask)` checks the batch's metadata and
allocates its scratch once; `step.verify(q, kv_cache, k_tree)` runs one layer in two launches
(sparse attention, combine) with only per-layer checks, no host sync, capturable in a CUDA graph.
As a dense step's kernels, the sparse kernel takes each CTA's work item from a schedule table the
step writes with a launch of its own on its first call and on reschedule()
(templates/sparse_schedule.cuh), and finds it for itself where qo_indptr changed since.
Row i of topk_indices lists the physical slots token i attends (-1 = no key, any order, distinct);
its keys are those slots plus the tree tokens its mask row shows (templates/sparse_attention.cuh).

As with dense steps (kgen/step.py), a step keeps the metadata tensors' addresses, not their values:
between calls and graph replays the caller may refill qo_indptr (same B and token count, at most
max_nodes a request), topk_indices (any slots inside the layer's cache) and tree_mask in place.
"""

from __future__ import annotations

import torch

from . import checks, env
from .kernels import SPARSE_COMBINE
from .kvargs import KVArgs
from .sparse_plan import (MIN_CHUNK, PART_O_BYTES, UNBOUNDED, list_capacity, request_splits, tile_tokens, tree_apart,
                          union_by_size)
from .splitkv import ceil_div, table_bytes

_ALIGN = 256
_BF16 = (torch.bfloat16,)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class SparseKernels:
    """A module's sparse kernels (its default plan's) and what sizes their launches."""

    def __init__(self, spec, kernels: dict, sm_count: int):
        self.spec, self.sm_count = spec, sm_count
        self.union, self.gather, self.schedule, self.combine = (
            kernels[n] for n in ("sparse_verify_attn", "sparse_gather_attn", "sparse_schedule", "sparse_combine"))
        self.bm = self.combine.variant.constants["BM"]
        self.capacity = list_capacity(self.union.variant.constants["TABLE"])  # a gather split's entries at most
        self.list_keys = self.union.variant.constants["LIST_KEYS"]  # a CTA's list scratch
        # The union queues an entry as its slot with its token in the top bits (templates/sparse_attention.cuh
        # SlotSet::queue_entry): the slots it reads stay below 2^(32 - those bits) (int32 slots: 2^31).
        token_bits = (tile_tokens(spec.model.num_q_heads, self.bm) - 1).bit_length()
        self.union_slots = 1 << (32 - token_bits)
        self.ctas_per_sm = self.union.variant.min_blocks
        self.target = sm_count * self.ctas_per_sm  # one wave of attention CTAs


def prefers_union(k: SparseKernels, num_tokens: int) -> bool:
    """Whether a step of `num_tokens` tree tokens runs the union kernel (else the per-token gather),
    when its caller does not say (kgen/sparse_plan.py union_by_size)."""
    return union_by_size(k.spec.model.num_q_heads, k.bm, num_tokens, k.target, k.ctas_per_sm)


def sparse_grid(k: SparseKernels, num_tokens: int, batch: int, union: bool = True) -> int:
    """An upper bound of the sparse schedule's work items (find_sparse_item). Splits of at least
    ceil(W / target) entries give at most target + sum_b R_b items, sum_b R_b <= ceil(num_tokens *
    H / BM) + batch; the gather kernel's splits of at most one list's capacity make at most
    ceil(E_max / capacity) >= 1 items per row tile, E_max = a row tile's tokens x index_topk entries."""
    row_tiles = ceil_div(num_tokens * k.spec.model.num_q_heads, k.bm) + batch
    if union:
        return k.target + row_tiles
    tile_tokens = min(k.bm, k.spec.tree.nodes)
    return k.target + row_tiles * ceil_div(tile_tokens * k.spec.model.index_topk, k.capacity)


def sparse_workspace_layout(k: SparseKernels, grid: int, batch: int, union: bool) -> tuple[int, int, int, int, int]:
    """Byte offsets of part_lse, req_meta, the key lists and the schedule table in a workspace
    (part_o starts it), and its size, for `grid` CTAs (a partial state of BM rows each, and for the
    union kernel a list of LIST_KEYS keys each: the gather kernel reads its list entries in place)."""
    rows = grid * k.bm
    part_lse = _aligned(rows * k.spec.model.value_dim * PART_O_BYTES)
    req_meta = part_lse + _aligned(rows * 4)
    lists = req_meta + _aligned(batch * 16)
    table = lists + _aligned(grid * 2 * k.list_keys * 4 if union else 0)
    return part_lse, req_meta, lists, table, table + _aligned(table_bytes(grid, batch))


class SparseStep:
    """One batch of sparse verify, prepared by Module.prepare_sparse; run a layer with verify().
    union=False runs the per-token-gather variant (each token's list read on its own); union=None
    picks the faster of the two for the batch (prefers_union). tree_apart: whether each row tile's
    tree is a split of its own (kgen/sparse_plan.py tree_apart). The kernel reads its work items from
    a schedule table where its plan builds it so (kgen/sparse_plan.py NO_TABLE); schedule_table=False
    (a one-shot call) and KGEN_VALIDATE (whose kernels check the lengths as they find their items)
    keep none."""

    def __init__(self, kernels: SparseKernels, state, qo_indptr, topk_indices, tree_mask, workspace=None,
                 union: bool | None = None, schedule_table: bool = True):
        spec, dev = kernels.spec, state.device
        self._state, self._device, self._spec = state, dev, spec
        self.qo_indptr = checks.indptr("qo_indptr", qo_indptr, length=None, device=dev)
        self.batch = batch = self.qo_indptr.numel() - 1
        self.topk_indices = checks.tensor("topk_indices", topk_indices, dtype=torch.int32, device=dev, ndim=2)
        self.num_tokens, width = self.topk_indices.shape
        if width > spec.model.index_topk:
            raise ValueError(f"topk_indices: {width} entries per row exceed the spec's index_topk "
                             f"{spec.model.index_topk}")
        if self.num_tokens * width >= 1 << 32:  # the kernels index the lists' entries in 32 bits
            raise ValueError(f"topk_indices: {self.num_tokens} x {width} entries exceed the 2^32 the sparse "
                             f"kernels address; split the batch")
        self.tree_mask = self._check_tree(spec, tree_mask)
        self.validate = env.flag("KGEN_VALIDATE")
        self.union = union = prefers_union(kernels, self.num_tokens) if union is None else union
        self.grid = sparse_grid(kernels, self.num_tokens, batch, union)
        if union and self.grid * 2 * kernels.list_keys >= 1 << 32:  # the union indexes its lists' masks in 32 bits
            raise ValueError(f"prepare_sparse: {self.grid} CTAs' key lists of {kernels.list_keys} keys each "
                             f"exceed the 2^32 entries the sparse kernels address; split the batch")
        self._empty = self.num_tokens == 0 or batch == 0
        part_lse, req_meta, lists, table, size = sparse_workspace_layout(kernels, self.grid, batch, union)
        if workspace is None:
            workspace = torch.empty(0 if self._empty else size, dtype=torch.uint8, device=dev)
        else:
            workspace = checks.tensor("workspace", workspace, dtype=torch.uint8, device=dev, ndim=1)
            if workspace.numel() < size:
                raise ValueError(f"workspace: this step needs {size} bytes (Module.sparse_workspace_bytes), "
                                 f"got {workspace.numel()}")
        self.workspace = workspace
        base = workspace.data_ptr()
        m = spec.model
        self._q_shape = (self.num_tokens, m.num_q_heads, m.head_dim)
        self._out_shape = (self.num_tokens, m.num_q_heads, m.value_dim)
        self._lse_shape = (self.num_tokens, m.num_q_heads)
        self._kv = KVArgs(spec, dev)
        self._kernel = kernels.union if union else kernels.gather
        self._union_slots = kernels.union_slots
        max_chunk = UNBOUNDED if union else kernels.capacity
        # Whether each row tile's tree is a split of its own (one request: its length is the step's,
        # clamped at max_nodes as its kernels clamp it).
        row_tiles, splits = request_splits(spec.model.num_q_heads, kernels.bm, min(self.num_tokens, spec.tree.nodes),
                                           width, kernels.target, max_chunk)
        self.tree_apart = tree_apart(batch, row_tiles, splits, kernels.target)
        schedule = dict(qo_indptr=self.qo_indptr, topk_width=width, batch=batch, target_ctas=kernels.target,
                        min_chunk=MIN_CHUNK, max_chunk=max_chunk, max_nodes=spec.tree.nodes, total_tokens=self.num_tokens,
                        tree_apart=int(self.tree_apart))
        reads_table = self._kernel.variant.constants["SCHEDULE_TABLE"]  # kgen/sparse_plan.py reads_table
        self.schedule_table = base + table if schedule_table and reads_table and not self.validate and not self._empty \
            else 0
        self._block = self._kernel.layout.pack(
            q=None, kv_cache=None, kv_scale=1.0, k_tree=None, tree_mask=self.tree_mask,
            topk_indices=self.topk_indices, **schedule, validate=int(self.validate), error_flag=state.error_flag,
            req_meta=base + req_meta, part_o=base, part_lse=base + part_lse, lists=base + lists, num_slots=0,
            schedule_table=self.schedule_table)
        self._schedule = kernels.schedule
        self._schedule_block = kernels.schedule.layout.pack(**schedule, table=self.schedule_table)
        self._unscheduled = bool(self.schedule_table)  # the first call writes the table
        self._combine = kernels.combine
        rows = self.num_tokens * spec.model.num_q_heads
        self._combine_threads = SPARSE_COMBINE.threads(spec.model.value_dim, rows, self.grid, kernels.bm, batch,
                                                       kernels.sm_count)
        self._combine_block = self._combine.layout.pack(part_o=base, part_lse=base + part_lse,
                                                        qo_indptr=self.qo_indptr, req_meta=base + req_meta,
                                                        batch=batch, o=None, lse=None)

    def _check_tree(self, spec, tree_mask):
        tree = spec.tree
        if tree.is_static:
            if tree_mask is not None:
                raise ValueError(f"tree_mask: spec {spec.name} has a static tree compiled in; pass None")
            if self.num_tokens != self.batch * tree.nodes:
                raise ValueError(f"topk_indices: a static tree of {tree.nodes} nodes needs {self.batch} x "
                                 f"{tree.nodes} rows, got {self.num_tokens}")
            return None
        if isinstance(tree_mask, torch.Tensor) and tree_mask.dim() == 2 and tree_mask.shape[1] < tree.mask_words:
            raise ValueError(f"tree_mask: {tree_mask.shape[1]} int32 words per row are narrower than max_nodes "
                             f"{tree.nodes} needs ({tree.mask_words})")
        return checks.tensor("tree_mask", tree_mask, dtype=torch.int32, device=self._device,
                             shape=(self.num_tokens, tree.mask_words))

    def reschedule(self) -> None:
        """Write the step's schedule table again from what qo_indptr holds now (one launch, on the
        current stream): after refilling it in place, so that the next calls read their work items
        rather than find them."""
        if self.schedule_table:
            self._write_table(self._state.stream())

    def _write_table(self, stream) -> None:
        self._schedule.launch(self.grid, self._schedule_block, stream)
        self._unscheduled = False

    def verify(self, q, kv_cache, k_tree, *, kv_scale=1.0, out=None, lse=None):
        """Sparse attention of the batch's tree tokens over their listed slots and trees: (out, lse)."""
        dev, v = self._device, self._block.values
        v.kv_scale = kv_scale = self._kv.scale(kv_scale)
        v.q = checks.address("q", q, dtypes=_BF16, device=dev, shape=self._q_shape)
        v.kv_cache, v.num_slots = self._kv.cache(kv_cache)
        if self.union and min(v.num_slots, 1 << 31) > self._union_slots:
            raise ValueError(f"kv_cache: {v.num_slots} rows exceed the {self._union_slots} the union kernel "
                             f"addresses; prepare the step with union=False")
        v.k_tree, k_tree = self._kv.tree(k_tree, self.num_tokens, kv_scale)  # held until the launch
        if out is None:
            out = torch.empty(self._out_shape, dtype=torch.bfloat16, device=dev)
        if lse is None:
            lse = torch.empty(self._lse_shape, dtype=torch.float32, device=dev)
        c = self._combine_block.values
        c.o = checks.address("out", out, dtypes=_BF16, device=dev, shape=self._out_shape)
        c.lse = checks.address("lse", lse, dtypes=(torch.float32,), device=dev, shape=self._lse_shape)
        if self._empty:
            return out, lse
        if self.validate:
            check_distinct(self.topk_indices)
            self._state.error_flag.zero_()
        stream = self._state.stream()
        if self._unscheduled:
            self._write_table(stream)
        self._kernel.launch(self.grid, self._block, stream)
        self._combine.launch(self.num_tokens * self._q_shape[1], self._combine_block, stream, self._combine_threads)
        if self.validate:
            flag = int(self._state.error_flag.item())  # KGEN_VALIDATE=1 is a debug mode: the sync is expected
            if flag & 1:
                raise ValueError("qo_indptr: a request has a negative length or more tree tokens than the spec's "
                                 "max_nodes, or qo_indptr does not run from 0 to the rows of topk_indices "
                                 "(KGEN_VALIDATE)")
            if flag & 2:
                raise ValueError("topk_indices: a slot lies outside kv_cache (KGEN_VALIDATE)")
        return out, lse


def check_distinct(topk_indices: torch.Tensor) -> None:
    """The slots of each row are distinct (-1 aside): raises a ValueError naming the first bad row."""
    if topk_indices.shape[1] < 2:
        return
    s = topk_indices.sort(dim=1).values
    dup = ((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).any(1)
    if bool(dup.any()):
        row = int(dup.nonzero()[0, 0])
        raise ValueError(f"topk_indices: row {row} lists a slot more than once; the slots of a row must be "
                         f"distinct (KGEN_VALIDATE)")
