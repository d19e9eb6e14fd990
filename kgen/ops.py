"""The ops of DESIGN §5 on one GPU: kgen.jit(spec) returns a Module.

Every op launches on torch.cuda.current_stream(), allocates only through torch, never syncs
with the host (unless KGEN_VALIDATE=1) and so can be captured in a CUDA graph: all launch
sizes derive from tensor shapes, and each attention CTA finds its split-KV work item on the
device (templates/schedule.cuh). Attention runs through prepared steps (kgen/step.py): the
one-shot ops prepare a step for one call. A Module puts together what does the work: the loaded
plans and kernels (kgen/loading.py), the per-batch plan choice (kgen/choice.py), the device state
(kgen/device.py), merge (kgen/merge.py) and defrag (kgen/defrag.py).
"""

from __future__ import annotations

import torch

from . import checks
from .choice import PlanChoice
from .defrag import Defrag
from .designs import Tiles
from .device import DeviceState
from .kernels import DEFRAG
from .loading import LoadedPlans, load, resolve_device, target_of
from .merge import merge_states
from .runtime import current_stream
from .sparse import SparseKernels, SparseStep, sparse_grid, sparse_workspace_layout
from .spec import Spec
from .step import Step, StepContext

__all__ = ["Module"]


class Module:
    def __init__(self, spec: Spec, device: torch.device | str | None = None, tiles: Tiles | None = None,
                 arch: str | None = None):
        """Load `spec`'s kernels for the GPU `device` (default: the current one), with the plan of
        that GPU's arch or of `arch` (e.g. the sm_120 plan on an H200): its heuristic tiling (or
        `tiles`), and the tilings a tuned table picks for some buckets."""
        device = resolve_device(device)
        target = target_of(device, arch)
        choice = PlanChoice.find(spec, target.plan_arch, tiles, target.cubin_arch)
        self._assemble(load(spec, target, choice.tilings(), device), choice,
                       DeviceState(device, current_stream(device)))

    @classmethod
    def of(cls, loaded: LoadedPlans, choice: PlanChoice, state: DeviceState) -> Module:
        """A module of plans and kernels loaded by the caller (e.g. stand-in kernels on a CPU)."""
        module = cls.__new__(cls)
        module._assemble(loaded, choice, state)
        return module

    def _assemble(self, loaded: LoadedPlans, choice: PlanChoice, state: DeviceState) -> None:
        self.spec, self.target, self.device = loaded.spec, loaded.target, state.device
        self.choice, self.table = choice, choice.table
        self.plan = loaded.plans[choice.default]
        self._ctx = StepContext(loaded.spec, loaded, choice, state)
        # merge and defrag kernels do not depend on the tiling: the default plan's serve every batch
        self._kernels = loaded.kernels[choice.default]
        self._defrag = Defrag(self._kernels[DEFRAG.name], loaded.target.sm_count, state.device)
        self._state = state
        # a sparse spec's kernels: the default plan's (tuned tables do not choose among sparse tilings)
        self._sparse = SparseKernels(loaded.spec, self._kernels, loaded.target.sm_count) if self.spec.model.sparse \
            else None

    # ---- attention -------------------------------------------------------------------------

    def prepare(self, qo_indptr, kv_indptr=None, kv_indices=None, kv_lens=None, tree_mask=None, *,
                num_tokens: int | None = None, workspace: torch.Tensor | None = None) -> Step:
        """Check one batch's metadata and allocate its scratch once; then run each layer with
        step.verify(q, kv_cache, k_tree), step.prefix(q, kv_cache) or step.tree(q, k_tree).

        Leave out the prefix metadata (all three) or the tree mask where the step needs no prefix
        or no tree. num_tokens (the rows of q) defaults to tree_mask's rows, or B x nodes of a
        static tree. workspace: a uint8 tensor of at least workspace_bytes(num_tokens, B) bytes
        to use instead of allocating (e.g. one shared by the steps of several captured graphs).
        What the caller may refill between calls and graph replays, and Step.reschedule() after
        refilling the lengths: see kgen/step.py.
        """
        return Step(self._ctx, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, num_tokens, workspace)

    def _one_call(self, qo_indptr, kv_indptr=None, kv_indices=None, kv_lens=None, tree_mask=None, *,
                  num_tokens: int, workspace: torch.Tensor | None = None) -> Step:
        """A step for one call: no schedule table (its launch would not pay for itself)."""
        return Step(self._ctx, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, num_tokens, workspace,
                    schedule_table=False)

    def workspace_bytes(self, num_tokens: int, batch: int) -> int:
        """Scratch bytes of a step with `num_tokens` tree tokens in `batch` requests (whichever
        of the module's tilings its bucket runs)."""
        return self._ctx.workspace_bytes(num_tokens, batch)

    # The one-shot ops: a step prepared for one call.

    def prefix_attention(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, *, kv_scale=1.0,
                         out=None, lse=None):
        """Attention of the tree tokens against their paged prefixes only."""
        step = self._one_call(qo_indptr, kv_indptr, kv_indices, kv_lens, num_tokens=self._rows(q))
        return step.prefix(q, kv_cache, kv_scale=kv_scale, out=out, lse=lse)

    def tree_attention(self, q, k_tree, qo_indptr, tree_mask, *, kv_scale=1.0, out=None, lse=None):
        """Attention of the tree tokens against each other under the tree mask only."""
        step = self._one_call(qo_indptr, tree_mask=tree_mask, num_tokens=self._rows(q))
        return step.tree(q, k_tree, kv_scale=kv_scale, out=out, lse=lse)

    def verify_attention(self, q, kv_cache, k_tree, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, *,
                         kv_scale=1.0, out=None, lse=None):
        """Prefix + tree attention of every tree token: merge(prefix_attention, tree_attention)."""
        step = self._one_call(qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, num_tokens=self._rows(q))
        return step.verify(q, kv_cache, k_tree, kv_scale=kv_scale, out=out, lse=lse)

    # Sparse (DSA) verify, DESIGN §12 (kgen/sparse.py): specs with model.index_topk.

    def prepare_sparse(self, qo_indptr, topk_indices, tree_mask=None, *, workspace: torch.Tensor | None = None,
                       union: bool | None = None) -> SparseStep:
        """Check one batch's top-k lists (and tree masks) and allocate its scratch once; then run
        each layer with step.verify(q, kv_cache, k_tree). union: True the union kernel, False the
        per-token-gather variant, None the faster for the batch (kgen/sparse.py prefers_union)."""
        return SparseStep(self._sparse_kernels(), self._state, qo_indptr, topk_indices, tree_mask, workspace, union)

    def sparse_workspace_bytes(self, num_tokens: int, batch: int, union: bool | None = None) -> int:
        """Scratch bytes of a sparse step with `num_tokens` tree tokens in `batch` requests; union=None
        (prepare_sparse's choice by size): enough for either kernel, so that a workspace sized for
        the largest batch also holds the smaller steps that pick the other one."""
        k = self._sparse_kernels()
        kinds = (True, False) if union is None else (union,)
        return max(sparse_workspace_layout(k, sparse_grid(k, num_tokens, batch, u), batch, u)[4] for u in kinds)

    def sparse_verify_attention(self, q, kv_cache, k_tree, qo_indptr, topk_indices, tree_mask, *, kv_scale=1.0,
                                out=None, lse=None):
        """Each tree token over its listed prefix slots and its visible tree tokens, one softmax."""
        step = SparseStep(self._sparse_kernels(), self._state, qo_indptr, topk_indices, tree_mask,
                          schedule_table=False)  # one call: its CTAs find their items
        return step.verify(q, kv_cache, k_tree, kv_scale=kv_scale, out=out, lse=lse)

    def _sparse_kernels(self) -> SparseKernels:
        if self._sparse is None:
            raise ValueError(f"prepare_sparse: spec {self.spec.name} has no model.index_topk (it is a dense spec)")
        return self._sparse

    def _rows(self, q) -> int:
        """The rows of a one-shot op's q (the step checks q again, as the layer's query)."""
        m = self.spec.model
        return checks.tensor("q", q, dtype=torch.bfloat16, device=self.device,
                             shape=(None, m.num_q_heads, m.head_dim)).shape[0]

    # ---- merge and defrag -----------------------------------------------------------------

    def merge_states(self, o_a, lse_a, o_b, lse_b, *, out=None, lse=None):
        """Merge two attention states of the same rows as if their key sets were united."""
        return merge_states(self._kernels, self.target.sm_count, self.device, o_a, lse_a, o_b, lse_b,
                            out=out, lse=lse)

    def defrag(self, kv_caches, src, dst) -> None:
        """For every layer and n: cache[dst[n]] = old cache[src[n]] (reads before writes)."""
        self._defrag(kv_caches, src, dst)
