"""kgen's half of its SGLang DSA backend (sglang_dsa.py): what SGLang's DSA backend and indexer
produce for a batch -> kgen's sparse verify inputs (DESIGN §12). No SGLang import
(tests/test_sglang_dsa.py).

SGLang's top-k lists hold physical KV slots, of the prefix and of the batch's own tree tokens (the
indexer scores those too). Each layer has its own lists, so a batch's prepared step (kgen's
`prepare_sparse`, once per forward batch) keeps two buffers the layers write their split into: the
step reads its work items from its schedule table, which a one-shot call per layer would find
again in every CTA (bench/NOTES.md v86, ~1.6 us a layer). kgen's kernel takes the prefix part as the lists and the tree part as the
tree mask: `split` cuts the batch's tree tokens out of each list and ANDs which of them the list
holds into the draft tree's mask. `hide_non_ancestors` makes the indexer's selection tree-aware: in
each row's logits, the tree tokens that are not the row's ancestors (or itself) get -inf.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..mask import mask_from_dense, mask_from_sglang, unpack_bits


@dataclass
class Tree:
    """One batch's tree tokens (n per request, B requests, R = B·n rows)."""

    n: int
    qo_indptr: torch.Tensor  # [B+1] int32
    tree_mask: torch.Tensor  # [R, words] int32: the draft tree (DESIGN §5 layout)
    slots: torch.Tensor  # [R] int64: each tree token's own KV slot (SGLang's out_cache_loc)
    row_base: torch.Tensor  # [R] int32: global row of its request's first tree token
    cols: torch.Tensor  # [R, n] int64: logit column of tree token j in row i's request (prefix + j)
    hidden: torch.Tensor  # [R, n] bool: tree token j is not an ancestor of (or) row i
    lists: torch.Tensor  # [R, K] int32: a layer's lists without the tree tokens (split(out=))
    mask: torch.Tensor  # [R, words] int32: the tree mask ANDed with a layer's picks (split(out=))
    step: object = None  # the batch's prepared sparse step over qo_indptr, lists and mask


class KgenDSA:
    """Builds kgen's sparse-verify inputs from what SGLang's DSA backend and indexer produce, and
    runs it. `slot_tree` maps a KV slot to the tree row (b·n + j) that owns it in this batch, so a
    list entry is found to be a tree token in one gather."""

    def __init__(self, module, num_slots: int):
        self.module = module
        m, tree = module.spec.model, module.spec.tree
        self.heads, self.dim, self.vdim, self.scale = m.num_q_heads, m.head_dim, m.value_dim, m.softmax_scale
        self.max_nodes, self.words = tree.nodes, tree.mask_words
        self.device = module.device
        self.slot_tree = torch.full((num_slots,), -1, dtype=torch.int32, device=self.device)
        self.topk = module.spec.model.index_topk  # the lists' width (SGLang's top-k)
        self._owned: torch.Tensor | None = None  # the slots slot_tree marks now
        self.graph: dict[str, torch.Tensor] | None = None
        # CUDA graphs: a step per batch shape, kept while its graph may replay, over one workspace
        # (graphs replay one at a time)
        self._graph_steps: dict[tuple[int, int], object] = {}
        self._graph_workspace: torch.Tensor | None = None

    def init_graph(self, max_bs: int, n: int) -> None:
        """Address-stable buffers for CUDA-graph capture and replay (up to max_bs requests of n)."""
        rows = max_bs * n
        z = functools.partial(torch.zeros, device=self.device)
        self.graph = dict(qo_indptr=z(max_bs + 1, dtype=torch.int32), tree_mask=z(rows, self.words, dtype=torch.int32),
                          slots=z(rows, dtype=torch.int64), row_base=z(rows, dtype=torch.int32),
                          cols=z(rows, n, dtype=torch.int64), hidden=z(rows, n, dtype=torch.bool),
                          lists=z(rows, self.topk, dtype=torch.int32), mask=z(rows, self.words, dtype=torch.int32))
        self._graph_steps.clear()
        self._graph_workspace = z(self.module.sparse_workspace_bytes(rows, max_bs), dtype=torch.uint8)

    def plan(self, slots: torch.Tensor, prefix_lens: torch.Tensor, n: int, custom_mask: torch.Tensor | None = None,
             *, graph: bool = False) -> Tree:
        """The batch's tree: B = len(prefix_lens) requests of n tree tokens at `slots` (B·n, request
        order), prefix lengths without them; custom_mask: SGLang's flat verify mask or None (a
        chain; n = 1 is decode). graph: written into the init_graph buffers."""
        bs, dev = prefix_lens.numel(), self.device
        if n > self.max_nodes:
            raise ValueError(f"{n} draft tokens per request exceed the kgen spec's max_nodes {self.max_nodes}")
        rows = bs * n
        if self._owned is not None:  # forget the previous batch's tree tokens (prefix tokens now)
            self.slot_tree[self._owned] = -1
        prefix = prefix_lens.to(dev, torch.int64)
        if custom_mask is not None:
            mask = mask_from_sglang(custom_mask, prefix_lens, n, self.words)
        else:
            chain = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            mask = mask_from_dense(chain, self.words).repeat(bs, 1)
        j = torch.arange(n, device=dev)
        tree = Tree(n=n, qo_indptr=torch.arange(0, rows + 1, n, dtype=torch.int32, device=dev), tree_mask=mask,
                    slots=slots[:rows].to(dev, torch.int64),
                    row_base=torch.arange(rows, dtype=torch.int32, device=dev) // n * n,
                    cols=prefix.repeat_interleave(n).unsqueeze(1) + j, hidden=~unpack_bits(mask, n),
                    # written by every layer's split before its step reads them
                    lists=torch.empty(rows, self.topk, dtype=torch.int32, device=dev), mask=torch.empty_like(mask))
        if graph:
            tree = self._fixed(tree, bs)
        else:
            tree.step = self.module.prepare_sparse(tree.qo_indptr, tree.lists, tree.mask)
        self.slot_tree[tree.slots] = torch.arange(rows, dtype=torch.int32, device=dev)
        self._owned = tree.slots.clone()
        return tree

    def _fixed(self, tree: Tree, bs: int) -> Tree:
        """`tree` copied into the init_graph buffers, with the step of its batch shape: prepared for
        the capture, then reused at every replay; its schedule table is written now (before a
        capture or a replay: the workspace it lives in is every captured step's)."""
        if self.graph is None:
            raise RuntimeError("KgenDSA.plan(graph=True) before init_graph()")
        n, rows = tree.n, bs * tree.n
        fixed = {field: self.graph[field][:rows] for field in ("lists", "mask")}  # the layers' splits fill them
        for field in ("qo_indptr", "tree_mask", "slots", "row_base", "cols", "hidden"):
            buf = self.graph[field][:bs + 1 if field == "qo_indptr" else rows]
            fixed[field] = buf[:, :n] if field in ("cols", "hidden") else buf  # decode: n = 1 column
            fixed[field].copy_(getattr(tree, field))
        step = self._graph_steps.get((bs, n))
        if step is None:
            step = self._graph_steps[bs, n] = self.module.prepare_sparse(
                fixed["qo_indptr"], fixed["lists"], fixed["mask"], workspace=self._graph_workspace)
        step.reschedule()
        return Tree(n=n, **fixed, step=step)

    def hide_non_ancestors(self, logits: torch.Tensor, tree: Tree) -> None:
        """The indexer's logits [rows, columns] (column = a token's position in its request), in
        place: in row i, the columns of tree tokens that are not i's ancestors (or i) get -inf."""
        rows = min(logits.shape[0], tree.cols.shape[0])
        cols = tree.cols[:rows].clamp(max=logits.shape[1] - 1)
        values = logits[:rows].gather(1, cols).masked_fill(tree.hidden[:rows], float("-inf"))
        logits[:rows].scatter_(1, cols, values)

    def split(self, lists: torch.Tensor, tree: Tree, *, out: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's top-k lists [R, K] (physical slots, -1 = none) -> (the prefix part: the lists
        with the batch's tree tokens cut out, [R, K] int32; the tree mask ANDed with which tree
        tokens each row's list holds, [R, words] int32). out: written into tree.lists and
        tree.mask (the step's buffers; K must be their width)."""
        owner = self.slot_tree[lists.clamp(min=0).long()]
        j = owner - tree.row_base.unsqueeze(1)
        in_tree = (lists >= 0) & (owner >= 0) & (j >= 0) & (j < tree.n)
        picked = torch.zeros(lists.shape[0], tree.n + 1, dtype=torch.bool, device=lists.device)
        picked.scatter_(1, torch.where(in_tree, j, tree.n).long(), True)
        picks = mask_from_dense(picked[:, :tree.n], self.words)
        if not out:
            return lists.masked_fill(in_tree, -1).to(torch.int32), tree.tree_mask & picks
        tree.lists.copy_(lists).masked_fill_(in_tree, -1)
        torch.bitwise_and(tree.tree_mask, picks, out=tree.mask)
        return tree.lists, tree.mask

    def attend(self, q_nope: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, lists: torch.Tensor,
               tree: Tree, out: torch.Tensor | None = None) -> torch.Tensor:
        """One layer: q as SGLang's absorbed-core call passes it (q_nope [R, H·512] or [R, H, 512],
        q_rope [R, H, 64]), the layer's cache (the tree tokens' rows already stored), the layer's
        top-k lists -> o [R, H, 512]. The tree tokens' own keys are their rows in the cache, read
        as SGLang's DSA backend reads them. SGLang keeps 656-byte scaled rows in a float8-typed
        tensor; kgen reads them as the bytes they are (DESIGN §11)."""
        rows = tree.slots.shape[0]
        if kv_cache.dtype == torch.float8_e4m3fn and kv_cache.shape[-1] != self.dim:
            kv_cache = kv_cache.view(torch.uint8)
        q = torch.cat([q_nope.reshape(rows, self.heads, self.vdim),
                       q_rope.reshape(rows, self.heads, self.dim - self.vdim)], dim=-1)
        k_tree = kv_cache.reshape(kv_cache.shape[0], -1)[tree.slots]
        if out is None:
            out = q.new_empty(rows, self.heads, self.vdim)
        if tree.step is not None and lists.shape == tree.lists.shape:
            self.split(lists, tree, out=True)
            tree.step.verify(q, kv_cache, k_tree, out=out.view(rows, self.heads, self.vdim))
        else:  # lists of another width than SGLang's top-k gives: a one-shot call
            prefix, mask = self.split(lists, tree)
            self.module.sparse_verify_attention(q, kv_cache, k_tree, tree.qo_indptr, prefix, mask,
                                                out=out.view(rows, self.heads, self.vdim))
        return out

    def serves(self, layer) -> bool:
        """The layer is the absorbed-MLA attention kgen was built for."""
        return (layer.qk_head_dim == self.dim and layer.v_head_dim == self.vdim and layer.tp_q_head_num == self.heads
                and layer.tp_k_head_num == 1 and float(layer.scaling) == self.scale and not layer.logit_cap
                and not layer.is_cross_attention)


def physical_lists(lists: torch.Tensor, page_table_1: torch.Tensor) -> torch.Tensor:
    """Logical top-k positions [R, K] (SGLANG_DSA_FUSE_TOPK=0) -> physical slots through the
    token-level page table [R, max_len] (-1 stays -1)."""
    slots = page_table_1.gather(1, lists.clamp(min=0).long())
    return torch.where(lists >= 0, slots.to(torch.int32), -1)
