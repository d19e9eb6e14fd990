"""The ops of DESIGN §5 on one GPU: kgen.jit(spec) returns a Module.

Every op launches on torch.cuda.current_stream(), allocates only through torch, never syncs
with the host (unless KGEN_VALIDATE=1) and so can be captured in a CUDA graph: all launch
sizes derive from tensor shapes, and each attention CTA finds its split-KV work item on the
device (templates/schedule.cuh). Attention runs through prepared steps (kgen/step.py): the
one-shot ops prepare a step for one call.
"""

from __future__ import annotations

import os

import torch

from . import checks
from .arch import arch_for_capability, get_arch
from .build import build
from .cache import env_flag
from .plan import MIN_SPLIT_TILES, Plan, Tiles, ceil_div, plan, work_capacity
from .runtime import Kernel, current_stream
from .sparse import SparseStep, sparse_grid, sparse_workspace_layout
from .spec import Spec
from .step import Step, target_ctas, workspace_layout
from .tuning import Bucket, find_table, tiles_text

__all__ = ["Module", "MIN_SPLIT_TILES"]

DEFRAG_STAGING_BYTES = int(os.environ.get("KGEN_DEFRAG_STAGING_BYTES", 1 << 30))
ZERO_LENS = 1024  # requests a tree-only call can have before the zero-lengths buffer grows


class Module:
    def __init__(self, spec: Spec, device: torch.device | str | None = None, tiles: Tiles | None = None,
                 arch: str | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("kgen.jit needs a CUDA GPU (torch.cuda.is_available() is False)")
        self.device = torch.device(device or "cuda")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.spec = spec
        props = torch.cuda.get_device_properties(self.device)
        self.arch = arch_for_capability(props.major, props.minor)  # the GPU present: what the cubins are for
        # The plan of the GPU present, or of `arch` (e.g. the sm_120 plan tested on an H200): the
        # heuristic tiling (or `tiles`), and the tilings a tuned table picks for some buckets.
        plan_arch = get_arch(arch) if arch else self.arch
        self.plan: Plan = plan(spec, plan_arch, tiles=tiles)
        self.table = None if tiles else find_table(spec, plan_arch.name)
        self.plans = {tiles_text(self.plan.tiles): self.plan}
        for choice in (self.table.choices.values() if self.table else ()):
            self.plans.setdefault(tiles_text(choice.tiles), plan(spec, plan_arch, tiles=choice.tiles))
        self.sm_count = props.multi_processor_count
        self._kernels = {}
        loaded: dict[str, Kernel] = {}  # by variant id: plans share their merge, defrag and combine kernels
        for text, p in self.plans.items():
            built = build(p, [self.arch.name])
            self._kernels[text] = {b.variant.name: loaded.get(b.variant.variant_id) or
                                   loaded.setdefault(b.variant.variant_id, Kernel(b, self.device)) for b in built}
            if p is self.plan:
                self.built = built
        self.k = self._kernels[tiles_text(self.plan.tiles)]
        self._layer_tables: dict[tuple[int, ...], torch.Tensor] = {}
        self.stream = current_stream(self.device)
        self.error_flag = torch.zeros(1, dtype=torch.int32, device=self.device)  # KGEN_VALIDATE reports
        self._zeros = torch.zeros(ZERO_LENS, dtype=torch.int32, device=self.device)
        torch.cuda.synchronize(self.device)  # both are filled before any stream (a graph's) reads them

    # ---- attention -------------------------------------------------------------------------

    def prepare(self, qo_indptr, kv_indptr=None, kv_indices=None, kv_lens=None, tree_mask=None, *,
                num_tokens: int | None = None, workspace: torch.Tensor | None = None) -> Step:
        """Check one batch's metadata and allocate its scratch once; then run each layer with
        step.verify(q, kv_cache, k_tree), step.prefix(q, kv_cache) or step.tree(q, k_tree).

        Leave out the prefix metadata (all three) or the tree mask where the step needs no prefix
        or no tree. num_tokens (the rows of q) defaults to tree_mask's rows, or B x nodes of a
        static tree. workspace: a uint8 tensor of at least workspace_bytes(num_tokens, B) bytes
        to use instead of allocating (e.g. one shared by the steps of several captured graphs).
        What the caller may refill between calls and graph replays: see kgen/step.py.
        """
        return Step(self, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, num_tokens, workspace)

    def workspace_bytes(self, num_tokens: int, batch: int) -> int:
        """Scratch bytes of a step with `num_tokens` tree tokens in `batch` requests (whichever
        of the module's tilings its bucket runs)."""
        return max(workspace_layout(self, p, work_capacity(p, num_tokens, batch, target_ctas(self, p))[0], batch)[2]
                   for p in self.plans.values())

    def plan_for(self, num_tokens: int, batch: int, context_tokens: int) -> tuple[Plan, dict[str, Kernel]]:
        """The plan (and its kernels) a batch runs: its bucket's tuned tiling, else the heuristic."""
        tiles = self.table.tiles_for(Bucket.of(num_tokens, batch, context_tokens)) if self.table else None
        text = tiles_text(tiles or self.plan.tiles)
        return self.plans[text], self._kernels[text]

    # The one-shot ops: a step prepared for one call.

    def prefix_attention(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, *, kv_scale=1.0,
                         out=None, lse=None):
        """Attention of the tree tokens against their paged prefixes only."""
        step = self.prepare(qo_indptr, kv_indptr, kv_indices, kv_lens, num_tokens=self._rows(q))
        return step.prefix(q, kv_cache, kv_scale=kv_scale, out=out, lse=lse)

    def tree_attention(self, q, k_tree, qo_indptr, tree_mask, *, kv_scale=1.0, out=None, lse=None):
        """Attention of the tree tokens against each other under the tree mask only."""
        step = self.prepare(qo_indptr, tree_mask=tree_mask, num_tokens=self._rows(q))
        return step.tree(q, k_tree, kv_scale=kv_scale, out=out, lse=lse)

    def verify_attention(self, q, kv_cache, k_tree, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, *,
                         kv_scale=1.0, out=None, lse=None):
        """Prefix + tree attention of every tree token: merge(prefix_attention, tree_attention)."""
        step = self.prepare(qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, num_tokens=self._rows(q))
        return step.verify(q, kv_cache, k_tree, kv_scale=kv_scale, out=out, lse=lse)

    # Sparse (DSA) verify, DESIGN §12 (kgen/sparse.py): specs with model.index_topk.

    def prepare_sparse(self, qo_indptr, topk_indices, tree_mask=None, *, workspace: torch.Tensor | None = None,
                       union: bool = True) -> SparseStep:
        """Check one batch's top-k lists (and tree masks) and allocate its scratch once; then run
        each layer with step.verify(q, kv_cache, k_tree). union=False: the per-token-gather variant."""
        return SparseStep(self, qo_indptr, topk_indices, tree_mask, workspace, union)

    def sparse_workspace_bytes(self, num_tokens: int, batch: int, union: bool = True) -> int:
        """Scratch bytes of a sparse step with `num_tokens` tree tokens in `batch` requests."""
        return sparse_workspace_layout(self, sparse_grid(self, num_tokens, batch, union), batch)[3]

    def sparse_verify_attention(self, q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask, *, kv_scale=1.0,
                                out=None, lse=None):
        """Each tree token over its listed prefix slots and its visible tree tokens, one softmax."""
        step = self.prepare_sparse(qo_indptr, topk_indices, tree_mask)
        return step.verify(q, kv_cache, k_tree, kv_scale=kv_scale, out=out, lse=lse)

    def _rows(self, q) -> int:
        """The rows of a one-shot op's q (the step checks q again, as the layer's query)."""
        m = self.spec.model
        return checks.tensor("q", q, dtype=torch.bfloat16, device=self.device,
                             shape=(None, m.num_q_heads, m.head_dim)).shape[0]

    def zero_lens(self, batch: int) -> torch.Tensor:
        """int32 zeros for at least `batch` requests: the prefix lengths of tree-only calls. One
        buffer per module, grown outside graph capture (a step holds the one it packed)."""
        if self._zeros.numel() < batch:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"tree attention of {batch} requests: run it once before capturing a CUDA graph "
                                   f"(it needs a larger zero-filled buffer, and filling one is a launch)")
            self._zeros = torch.zeros(2 * batch, dtype=torch.int32, device=self.device)
        return self._zeros

    # ---- merge ----------------------------------------------------------------------------

    def merge_states(self, o_a, lse_a, o_b, lse_b, *, out=None, lse=None):
        """Merge two attention states of the same rows as if their key sets were united."""
        dev = self.device
        if not isinstance(o_a, torch.Tensor):
            raise TypeError(f"o_a: expected a torch.Tensor, got {type(o_a).__name__}")
        if o_a.dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"o_a: expected dtype torch.bfloat16 or torch.float32, got {o_a.dtype}")
        shape = tuple(o_a.shape)
        if len(shape) < 2 or shape[-1] % 8:
            raise ValueError(f"o_a: expected [..., width] with width a multiple of 8, got shape {shape}")
        o_a = checks.tensor("o_a", o_a, dtype=o_a.dtype, device=dev, shape=shape)
        o_b = checks.tensor("o_b", o_b, dtype=o_a.dtype, device=dev, shape=shape)
        lse_a = checks.tensor("lse_a", lse_a, dtype=torch.float32, device=dev, shape=shape[:-1])
        lse_b = checks.tensor("lse_b", lse_b, dtype=torch.float32, device=dev, shape=shape[:-1])
        out = checks.out_tensor("out", out, shape=shape, dtype=o_a.dtype, device=dev)
        lse = checks.out_tensor("lse", lse, shape=shape[:-1], dtype=torch.float32, device=dev)
        rows = lse_a.numel()
        vecs = rows * (shape[-1] // 8)
        kernel = self.k["lse_merge_bf16" if o_a.dtype == torch.bfloat16 else "lse_merge_f32"]
        kernel(min(ceil_div(vecs, kernel.variant.threads), self.sm_count * 16),
               o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b, o=out, lse=lse, rows=rows, width=shape[-1])
        return out, lse

    # ---- defrag ---------------------------------------------------------------------------

    def defrag(self, kv_caches, src, dst) -> None:
        """For every layer and n: cache[dst[n]] = old cache[src[n]] (reads before writes)."""
        layers, num_slots, row_bytes = self._layer_table(kv_caches)
        if row_bytes % 16:
            raise ValueError(f"kv_caches: a row is {row_bytes} bytes; rows must be a multiple of 16 bytes")
        src = self._move_index("src", src)
        dst = self._move_index("dst", dst)
        if src.numel() != dst.numel():
            raise ValueError(f"src/dst: expected the same number of moves, got {src.numel()} and {dst.numel()}")
        n = src.numel()
        if n == 0:
            return
        if env_flag("KGEN_VALIDATE"):
            self._validate_moves(src, dst, num_slots)
        is_dst = torch.zeros(num_slots, dtype=torch.uint8, device=self.device)
        is_dst.index_fill_(0, dst, 1)  # a scalar fill: no host-to-device copy (graph capture)
        num_layers = layers.numel()
        row_chunks = row_bytes // 16
        group = max(1, min(num_layers, DEFRAG_STAGING_BYTES // max(1, n * row_bytes)))
        staging = torch.empty(group * n * row_chunks, 4, dtype=torch.int32, device=self.device)
        kernel = self.k["kv_defrag"]
        grid = min(ceil_div(n * row_chunks, kernel.variant.threads), self.sm_count * 8)
        for first in range(0, num_layers, group):  # one launch pair for all layers unless staging is capped
            part = layers[first:first + group]
            for phase in (0, 1):
                kernel(grid, layers=part, src=src, dst=dst, is_dst=is_dst, staging=staging, n=n,
                       num_layers=part.numel(), row_chunks=row_chunks, phase=phase)

    def _layer_table(self, kv_caches) -> tuple[torch.Tensor, int, int]:
        """Device array of per-layer base addresses, slots per layer, bytes per row."""
        if isinstance(kv_caches, torch.Tensor):
            c = checks.tensor("kv_caches", kv_caches, dtype=kv_caches.dtype, device=self.device, ndim=kv_caches.dim())
            if c.dim() not in (3, 4) or (c.dim() == 4 and c.shape[2] != 1):
                raise ValueError(f"kv_caches: expected [layers, slots, D] (or [layers, slots, 1, D]), got {tuple(c.shape)}")
            row_bytes = c.shape[-1] * c.element_size()
            stride = c.stride(0) * c.element_size()
            table = c.data_ptr() + stride * torch.arange(c.shape[0], device=self.device, dtype=torch.int64)
            return table, c.shape[1], row_bytes
        if not isinstance(kv_caches, (list, tuple)) or not kv_caches:
            raise TypeError("kv_caches: expected a stacked [layers, slots, D] tensor or a non-empty list of tensors")
        first = kv_caches[0]
        if not isinstance(first, torch.Tensor):
            raise TypeError(f"kv_caches[0]: expected a torch.Tensor, got {type(first).__name__}")
        for i, c in enumerate(kv_caches):
            checks.tensor(f"kv_caches[{i}]", c, dtype=first.dtype, device=self.device, shape=tuple(first.shape))
        key = tuple(c.data_ptr() for c in kv_caches)
        if key not in self._layer_tables:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("defrag: call it once with this list of layers before capturing a CUDA graph "
                                   "(its address table is uploaded on first use), or pass a stacked tensor")
            self._layer_tables[key] = torch.tensor(key, dtype=torch.int64).to(self.device)
        return self._layer_tables[key], first.shape[0], first[0].numel() * first.element_size()

    def _move_index(self, name: str, t) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}")
        return t.to(device=self.device, dtype=torch.int64).contiguous()

    @staticmethod
    def _validate_moves(src: torch.Tensor, dst: torch.Tensor, num_slots: int) -> None:
        for name, t in (("src", src), ("dst", dst)):
            if bool(((t < 0) | (t >= num_slots)).any()):
                raise ValueError(f"{name}: slot index outside [0, {num_slots}) (KGEN_VALIDATE)")
        if torch.unique(dst).numel() != dst.numel():
            raise ValueError("dst: slots must be distinct (KGEN_VALIDATE)")
