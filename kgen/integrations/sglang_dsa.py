"""kgen's sparse (DSA) attention in SGLang: GLM-5 / DeepSeek-V3.2 verifying draft trees with their
own sparse attention (DESIGN §12; docs/sglang.md, "GLM-5 with its sparse attention").

Opt-in: `KGEN_DSA=1` with `--attention-backend dsa`. kgen's plugin then puts `KgenDSABackend` in
the attention registry's "dsa" entry: SGLang's DeepseekSparseAttnBackend with two forward modes
taken over by kgen's sparse verify, and its indexer made tree-aware:

- TARGET_VERIFY (a chain or a tree) -> kgen's `sparse_verify_attention`: each tree token attends
  to the prefix slots SGLang's indexer picked for it and to the tree tokens its mask shows and the
  indexer picked (the selection of tree tokens is ANDed into the tree mask);
- DECODE without a draft -> the same op at T = 1;
- every other mode (prefill, draft extend, ...), layer or call kgen does not serve -> SGLang's DSA
  backend unchanged. Draft workers get SGLang's own DSA backend.

Why the "dsa" name and not "kgen": SGLang's DeepSeek/GLM model code chooses its attention path by
the backend's name (the absorbed-core call with separate rope parts, the DSA dispatch of prefill
between MHA and MLA), so a sparse backend must be called "dsa" to get the DSA model path.

The indexer (`dsa/dsa_indexer.py`) scores each draft row over prefix ∪ draft[0..i], which is a
chain's ancestors. For a tree, `get_indexer_metadata` returns SGLang's metadata with a
`topk_transform` that first hides, in each row's logits, the tree tokens that are not the row's
ancestors (or itself): a tree token then scores the prefix and its own path. On a chain this hides
nothing the indexer looks at, so the selection is SGLang's own. (EAGLE orders a tree's tokens
parents first, so a row's ancestors lie in draft[0..i].) The lists SGLang's top-k returns are
physical slots (or logical positions, with SGLANG_DSA_FUSE_TOPK=0, translated through the page
table here); the slots of the batch's own tree tokens are cut out of them into the mask.

`KgenDSA` is kgen's half (no SGLang import: tests/test_sglang_dsa.py); every SGLang name is in
sglang_compat.py (its DSA block, checked at registration when KGEN_DSA=1).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass

import torch

from ..cache import env_flag
from ..errors import KgenError
from ..mask import mask_from_dense, mask_from_sglang, unpack_bits
from . import sglang_compat as compat
from .sglang import DECODE, VERIFY, absorbed_mla_kind, kgen_mode

NAME = "dsa"
TREE_DRAFT_BACKENDS = ("flashinfer", "fa3", "triton")  # draft backends SGLang lets draft trees at page size > 1
logger = logging.getLogger(__name__)


def enabled() -> bool:
    return env_flag("KGEN_DSA")


# ---- registration ---------------------------------------------------------------------------


@functools.cache
def install() -> None:
    """Check SGLang's DSA internals, put kgen's DSA backend in the "dsa" registry entry (SGLang's
    own stays the draft workers' factory) and let SGLang's server-arg resolution accept draft
    trees at page size > 1 for it. Idempotent."""
    compat.check(dsa=True)
    compat.replace_backend(NAME, functools.partial(create_backend, own=compat.backend_factory(NAME)))
    compat.register_resolution_hook("handle_speculative_decoding", allow_trees)


def create_backend(model_runner, own):
    """The "dsa" registry entry: kgen's DSA backend for a target model, SGLang's for a draft."""
    if compat.is_draft_runner(model_runner):
        return own(model_runner)
    return backend_class()(model_runner)


def allow_trees(server_args, previous) -> None:
    """SGLang refuses EAGLE topk > 1 at page size > 1 unless the attention backend is one whose
    draft decode can branch (flashinfer, fa3, triton). With kgen's DSA backend the draft runs on
    `--speculative-draft-attention-backend` and kgen verifies the tree, so the check is shown
    that draft backend; afterwards the attention backend is "dsa" again."""
    view = compat.resolved_view(server_args)
    backend, draft = view.attention_backend, view.speculative_draft_attention_backend
    if backend == NAME and draft not in TREE_DRAFT_BACKENDS and (view.speculative_eagle_topk or 0) > 1 \
            and (view.page_size or 1) > 1:
        raise ValueError(f"EAGLE trees (--speculative-eagle-topk {view.speculative_eagle_topk}) at page size "
                         f"{view.page_size} with kgen's DSA backend need --speculative-draft-attention-backend "
                         f"{', '.join(TREE_DRAFT_BACKENDS[:-1])} or {TREE_DRAFT_BACKENDS[-1]} (SGLang's DSA draft "
                         f"decodes chains only); got {draft!r}")
    if backend != NAME or draft not in TREE_DRAFT_BACKENDS:
        previous(server_args)
        return
    compat.declare_resolution(server_args, "kgen_dsa", attention_backend=draft)
    previous(server_args)
    compat.declare_resolution(server_args, "kgen_dsa", attention_backend=backend)


@functools.cache
def backend_class() -> type:
    """KgenDSABackend: kgen's methods in front of SGLang's DeepseekSparseAttnBackend."""
    return type("KgenDSABackend", (_KgenDSAMethods, compat.dsa_backend_class()), {"__module__": __name__})


@functools.cache
def tree_metadata_class() -> type:
    """SGLang's DSAIndexerMetadata whose top-k first hides each row's non-ancestor tree tokens."""

    @dataclass(frozen=True)
    class TreeIndexerMetadata(compat.dsa_indexer_metadata_class()):
        tree: Tree | None = None
        kgen: KgenDSA | None = None

        def topk_transform(self, logits, topk, **kwargs):
            self.kgen.hide_non_ancestors(logits, self.tree)
            return super().topk_transform(logits, topk, **kwargs)

    return TreeIndexerMetadata


# ---- kgen's half: SGLang's lists and tree -> kgen's sparse verify inputs ------------------------


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
        self._owned: torch.Tensor | None = None  # the slots slot_tree marks now
        self.graph: dict[str, torch.Tensor] | None = None

    def init_graph(self, max_bs: int, n: int) -> None:
        """Address-stable buffers for CUDA-graph capture and replay (up to max_bs requests of n)."""
        rows = max_bs * n
        z = functools.partial(torch.zeros, device=self.device)
        self.graph = dict(qo_indptr=z(max_bs + 1, dtype=torch.int32), tree_mask=z(rows, self.words, dtype=torch.int32),
                          slots=z(rows, dtype=torch.int64), row_base=z(rows, dtype=torch.int32),
                          cols=z(rows, n, dtype=torch.int64), hidden=z(rows, n, dtype=torch.bool))

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
                    cols=prefix.repeat_interleave(n).unsqueeze(1) + j, hidden=~unpack_bits(mask, n))
        if graph:
            if self.graph is None:
                raise RuntimeError("KgenDSA.plan(graph=True) before init_graph()")
            fixed = {}
            for field in ("qo_indptr", "tree_mask", "slots", "row_base", "cols", "hidden"):
                buf = self.graph[field][:bs + 1 if field == "qo_indptr" else rows]
                fixed[field] = buf[:, :n] if field in ("cols", "hidden") else buf  # decode: n = 1 column
                fixed[field].copy_(getattr(tree, field))
            tree = Tree(n=n, **fixed)
        self.slot_tree[tree.slots] = torch.arange(rows, dtype=torch.int32, device=dev)
        self._owned = tree.slots.clone()
        return tree

    def hide_non_ancestors(self, logits: torch.Tensor, tree: Tree) -> None:
        """The indexer's logits [rows, columns] (column = a token's position in its request), in
        place: in row i, the columns of tree tokens that are not i's ancestors (or i) get -inf."""
        rows = min(logits.shape[0], tree.cols.shape[0])
        cols = tree.cols[:rows].clamp(max=logits.shape[1] - 1)
        values = logits[:rows].gather(1, cols).masked_fill(tree.hidden[:rows], float("-inf"))
        logits[:rows].scatter_(1, cols, values)

    def split(self, lists: torch.Tensor, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's top-k lists [R, K] (physical slots, -1 = none) -> (the prefix part: the lists
        with the batch's tree tokens cut out, [R, K] int32; the tree mask ANDed with which tree
        tokens each row's list holds, [R, words] int32)."""
        owner = self.slot_tree[lists.clamp(min=0).long()]
        j = owner - tree.row_base.unsqueeze(1)
        in_tree = (lists >= 0) & (owner >= 0) & (j >= 0) & (j < tree.n)
        prefix = lists.masked_fill(in_tree, -1).to(torch.int32)
        picked = torch.zeros(lists.shape[0], tree.n + 1, dtype=torch.bool, device=lists.device)
        picked.scatter_(1, torch.where(in_tree, j, tree.n).long(), True)
        return prefix, tree.tree_mask & mask_from_dense(picked[:, :tree.n], self.words)

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
        prefix, mask = self.split(lists, tree)
        if out is None:
            out = q.new_empty(rows, self.heads, self.vdim)
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


# ---- the SGLang side ----------------------------------------------------------------------------


def _kgen_for_model(backend, runner) -> tuple[KgenDSA | None, str]:
    """kgen's half for this model runner, or None and why SGLang's DSA backend keeps every mode."""
    from kgen.arch import arch_for_capability

    compat.check_instance(runner, "ModelRunner")
    compat.check_instance(backend, "DeepseekSparseAttnBackend", dsa=True)
    if backend.hisparse_coordinator is not None or compat.dsa_dcp_size(backend) > 1:
        return None, "HiSparse or decode context parallelism is on"
    pool = backend.token_to_kv_pool
    if not compat.is_dsa_pool(pool):
        return None, f"kgen reads SGLang's DSATokenToKVPool, not a {type(pool).__name__}"
    if runner.kv_cache_dtype == torch.bfloat16:
        cache = dict(kv_dtype="bfloat16")
    elif runner.kv_cache_dtype == torch.float8_e4m3fn and backend.dsa_kv_cache_store_fp8:
        cache = dict(kv_dtype="float8_e4m3fn", scales="per_block")  # the 656-byte scaled rows (DESIGN §11)
    else:
        return None, f"KV cache dtype {runner.kv_cache_dtype} without scaled rows (kgen reads bf16 or 656-byte fp8 rows)"
    cfg = runner.model_config
    layers = compat.attention_layers(runner.model)
    kind, why = absorbed_mla_kind(cfg, layers)
    if kind is None:
        return None, why
    heads, scale = kind
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    nodes = max(1, backend.speculative_num_draft_tokens or 1)
    module = sparse_module(dict(
        # one name per spec: kgen's torch ops know a spec by its name, process-wide
        name=f"sglang_dsa_h{heads}_k{backend.dsa_index_topk}_{'fp8' if 'scales' in cache else 'bf16'}_n{nodes}",
        model=dict(num_q_heads=heads, kv_lora_rank=cfg.kv_lora_rank, qk_rope_head_dim=cfg.qk_rope_head_dim,
                   softmax_scale=scale, index_topk=backend.dsa_index_topk),
        cache=dict(page_size=runner.page_size, **cache),
        tree=dict(max_nodes=nodes),
        target=dict(arch=arch_for_capability(props.major, props.minor).name)))
    if not hasattr(module, "sparse_verify_attention"):
        return None, f"kgen spec {module.spec.name} has no sparse verify (model.index_topk, DESIGN §12)"
    return KgenDSA(module, compat.key_buffer(backend, layers[0]).shape[0]), ""


def sparse_module(spec_data: dict):
    """kgen's compiled module for the spec derived from the model (or KGEN_SGLANG_SPEC's)."""
    import kgen
    from kgen.spec import parse_spec

    path = os.environ.get("KGEN_SGLANG_SPEC")
    return kgen.jit(kgen.load_spec(path) if path else parse_spec(spec_data, "the SGLang model config"))


class _KgenDSAMethods:
    """KgenDSABackend's own methods; backend_class() puts them in front of DeepseekSparseAttnBackend."""

    def __init__(self, model_runner, *args, **kwargs):
        super().__init__(model_runner, *args, **kwargs)
        try:
            self.kgen, self.kgen_off_reason = _kgen_for_model(self, model_runner)
        except compat.SGLangError:
            raise
        except KgenError as e:  # an arch kgen has no plan for, a spec kgen cannot build, ...
            self.kgen, self.kgen_off_reason = None, f"{type(e).__name__}: {e}"
        if self.kgen is None:
            if (self.topk or 0) > 1:
                raise compat.SGLangError(
                    f"kgen DSA backend: kgen is off ({self.kgen_off_reason}) and SGLang's DSA backend verifies "
                    f"chains only; run with --speculative-eagle-topk 1 or without KGEN_DSA=1")
            logger.warning("kgen DSA backend: every mode runs on SGLang's DSA backend (%s)", self.kgen_off_reason)
        else:
            spec = self.kgen.module.spec
            logger.info("kgen DSA backend: TARGET_VERIFY and DECODE run on kgen's sparse verify (%s: index_topk %d, "
                        "%s rows, page size %d, up to %d tree tokens); every other mode on SGLang's DSA backend",
                        spec.name, spec.model.index_topk, spec.cache.kv_dtype, spec.cache.page_size,
                        self.kgen.max_nodes)
        self.kgen_mode: str | None = None  # what the current batch's metadata prepared kgen for
        self._kgen_tree: Tree | None = None

    # -- metadata: once per forward batch (eager, before CUDA-graph capture and each replay) --
    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self._kgen_prepare(forward_batch, graph=False)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self.kgen is not None:
            self.kgen.init_graph(max_bs, max(1, self.speculative_num_draft_tokens or 1))

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False, **kwargs):
        super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture, **kwargs)
        self._kgen_prepare(forward_batch, graph=True)

    def _kgen_prepare(self, fb, *, graph: bool) -> None:
        mode = kgen_mode(fb) if self.kgen is not None else None
        self.kgen_mode, self._kgen_tree = mode, None
        if mode is None:
            return
        n = self.speculative_num_draft_tokens if mode == VERIFY else 1
        bs = fb.batch_size
        prefix = fb.seq_lens[:bs] if mode == VERIFY else fb.seq_lens[:bs] - 1  # decode: seq_lens holds the new token
        mask = compat.verify_mask(fb) if mode == VERIFY else None
        self._kgen_tree = self.kgen.plan(fb.out_cache_loc, prefix, n, mask, graph=graph)

    # -- the indexer: tree-aware top-k for a tree's batch --
    def get_indexer_metadata(self, layer_id: int, forward_batch):
        meta = super().get_indexer_metadata(layer_id, forward_batch)
        tree = self._kgen_tree
        if meta is None or self.kgen_mode != VERIFY or tree is None or tree.n == 1:
            return meta
        fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
        return tree_metadata_class()(**fields, tree=tree, kgen=self.kgen)

    # -- forward: kgen for the prepared mode on the calls it serves, else SGLang's DSA backend --
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                       topk_indices=None, **kwargs):
        if self._kgen_takes(VERIFY, q, k, q_rope, k_rope, topk_indices, layer, kwargs):
            return self._kgen_forward(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope, topk_indices)
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope, k_rope=k_rope,
                                      topk_indices=topk_indices, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                       topk_indices=None, **kwargs):
        if self._kgen_takes(DECODE, q, k, q_rope, k_rope, topk_indices, layer, kwargs):
            return self._kgen_forward(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope, topk_indices)
        return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope, k_rope=k_rope,
                                      topk_indices=topk_indices, **kwargs)

    def _kgen_takes(self, mode: str, q, k, q_rope, k_rope, topk_indices, layer, kwargs: dict) -> bool:
        """kgen runs this call: the batch was prepared for `mode`, the call is the absorbed-core
        one with its top-k lists (one row per tree token), and it passes nothing kgen does not
        implement (a fused rope, sinks, scaling, or any keyword a newer SGLang adds)."""
        tree = self._kgen_tree
        return (self.kgen_mode == mode and tree is not None and q.dtype == torch.bfloat16 and q_rope is not None
                and k is not None and k_rope is not None and topk_indices is not None and topk_indices.dim() == 2
                and topk_indices.shape[0] == q.shape[0] == tree.slots.shape[0]
                and all(value is None or value is False for value in kwargs.values()) and self.kgen.serves(layer))

    def _kgen_forward(self, q, k, layer, fb, save_kv_cache: bool, q_rope, k_rope, topk_indices):
        if save_kv_cache:
            compat.save_dsa_kv(self, layer, fb, k, k_rope)
        lists = topk_indices if self.use_fused_topk else physical_lists(topk_indices, compat.dsa_page_table_1(self))
        return self.kgen.attend(q, q_rope, compat.key_buffer(self, layer), lists, self._kgen_tree)
