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

`KgenDSA` (sglang_sparse.py) is kgen's half, without SGLang; every SGLang name is in
sglang_compat.py and sglang_dsa_compat.py (names: sglang_names.DSA_NAMES, checked at registration when KGEN_DSA=1).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass

import torch

from .. import env
from ..errors import KgenError
from . import sglang_compat as compat
from . import sglang_dsa_compat as dsa_compat
from .sglang_batch import DECODE, VERIFY, BatchHooks, absorbed_mla_kind, kgen_mode
from .sglang_sparse import KgenDSA, Tree, physical_lists

NAME = "dsa"
TREE_DRAFT_BACKENDS = ("flashinfer", "fa3", "triton")  # draft backends SGLang lets draft trees at page size > 1
logger = logging.getLogger(__name__)


def enabled() -> bool:
    return env.flag("KGEN_DSA")


# ---- registration ---------------------------------------------------------------------------


@functools.cache
def install() -> None:
    """Check SGLang's DSA internals, put kgen's DSA backend in the "dsa" registry entry (SGLang's
    own stays the draft workers' factory) and let SGLang's server-arg resolution accept draft
    trees at page size > 1 for it. Idempotent."""
    compat.check(dsa=True)
    dsa_compat.replace_backend(NAME, functools.partial(create_backend, own=dsa_compat.backend_factory(NAME)))
    dsa_compat.register_resolution_hook("handle_speculative_decoding", allow_trees)


def create_backend(model_runner, own):
    """The "dsa" registry entry: kgen's DSA backend for a target model, SGLang's for a draft."""
    if dsa_compat.is_draft_runner(model_runner):
        return own(model_runner)
    return backend_class()(model_runner)


def allow_trees(server_args, previous) -> None:
    """SGLang refuses EAGLE topk > 1 at page size > 1 unless the attention backend is one whose
    draft decode can branch (flashinfer, fa3, triton). With kgen's DSA backend the draft runs on
    `--speculative-draft-attention-backend` and kgen verifies the tree, so the check is shown
    that draft backend; afterwards the attention backend is "dsa" again."""
    view = dsa_compat.resolved_view(server_args)
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
    dsa_compat.declare_resolution(server_args, "kgen_dsa", attention_backend=draft)
    previous(server_args)
    dsa_compat.declare_resolution(server_args, "kgen_dsa", attention_backend=backend)


@functools.cache
def backend_class() -> type:
    """KgenDSABackend: kgen's methods in front of SGLang's DeepseekSparseAttnBackend."""
    return type("KgenDSABackend", (_KgenDSAMethods, dsa_compat.dsa_backend_class()), {"__module__": __name__})


@functools.cache
def tree_metadata_class() -> type:
    """SGLang's DSAIndexerMetadata whose top-k first hides each row's non-ancestor tree tokens."""

    @dataclass(frozen=True)
    class TreeIndexerMetadata(dsa_compat.dsa_indexer_metadata_class()):
        tree: Tree | None = None
        kgen: KgenDSA | None = None

        def topk_transform(self, logits, topk, **kwargs):
            self.kgen.hide_non_ancestors(logits, self.tree)
            return super().topk_transform(logits, topk, **kwargs)

    return TreeIndexerMetadata


# ---- the SGLang side ----------------------------------------------------------------------------


def _kgen_for_model(backend, runner) -> tuple[KgenDSA | None, str]:
    """kgen's half for this model runner, or None and why SGLang's DSA backend keeps every mode."""
    from kgen.arch import arch_for_capability

    compat.check_instance(runner, "ModelRunner")
    compat.check_instance(backend, "DeepseekSparseAttnBackend", dsa=True)
    if backend.hisparse_coordinator is not None or dsa_compat.dsa_dcp_size(backend) > 1:
        return None, "HiSparse or decode context parallelism is on"
    pool = backend.token_to_kv_pool
    if not dsa_compat.is_dsa_pool(pool):
        return None, f"kgen reads SGLang's DSATokenToKVPool, not a {type(pool).__name__}"
    if runner.kv_cache_dtype == torch.bfloat16:
        cache = dict(kv_dtype="bfloat16")
    elif runner.kv_cache_dtype == torch.float8_e4m3fn and backend.dsa_kv_cache_store_fp8:
        cache = dict(kv_dtype="float8_e4m3fn", scales="per_block")  # the 656-byte scaled rows (DESIGN §11)
    else:
        return None, (f"KV cache dtype {runner.kv_cache_dtype} without scaled rows "
                      f"(kgen reads bf16 or 656-byte fp8 rows)")
    cfg = runner.model_config
    layers = compat.attention_layers(runner.model)
    kind, why = absorbed_mla_kind(cfg, layers)
    if kind is None:
        return None, why
    heads, scale = kind
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    module = sparse_module(sparse_spec_data(
        heads, scale, cfg.kv_lora_rank, cfg.qk_rope_head_dim, backend.dsa_index_topk, runner.page_size, cache,
        max(1, backend.speculative_num_draft_tokens or 1), arch_for_capability(props.major, props.minor).name))
    if not hasattr(module, "sparse_verify_attention"):
        return None, f"kgen spec {module.spec.name} has no sparse verify (model.index_topk, DESIGN §12)"
    return KgenDSA(module, compat.key_buffer(backend, layers[0]).shape[0]), ""


def sparse_spec_data(heads: int, scale: float, latent: int, rope: int, index_topk: int, page_size: int,
                     cache: dict, nodes: int, arch: str) -> dict:
    """The sparse spec (as parse_spec takes it) of a DSA model: its heads per GPU, softmax scale,
    MLA dims and index_topk, the pool's page size and rows (`cache`: kv_dtype, and scales for the
    656-byte rows), the draft-token count and the GPU's arch."""
    return dict(
        # one name per spec: kgen's torch ops know a spec by its name, process-wide
        name=f"sglang_dsa_h{heads}_k{index_topk}_{'fp8' if 'scales' in cache else 'bf16'}_n{nodes}",
        model=dict(num_q_heads=heads, kv_lora_rank=latent, qk_rope_head_dim=rope, softmax_scale=scale,
                   index_topk=index_topk),
        cache=dict(page_size=page_size, **cache), tree=dict(max_nodes=nodes), target=dict(arch=arch))


def sparse_module(spec_data: dict):
    """kgen's compiled module for the spec derived from the model (or KGEN_SGLANG_SPEC's)."""
    import kgen
    from kgen.spec import parse_spec

    path = env.path("KGEN_SGLANG_SPEC")
    return kgen.jit(kgen.load_spec(path) if path else parse_spec(spec_data, "the SGLang model config"))


class _KgenDSAMethods(BatchHooks):
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

    # -- metadata: once per forward batch (BatchHooks: eager, before CUDA-graph capture and each replay) --
    def _kgen_init_graph(self, max_bs: int) -> None:
        self.kgen.init_graph(max_bs, max(1, self.speculative_num_draft_tokens or 1))

    def _kgen_prepare(self, fb, *, graph: bool, capture: bool = False) -> None:
        """This batch's tree and its prepared sparse step, which every layer runs on its own lists
        (graph: in the fixed buffers, the step of the batch shape kept from capture to every replay)."""
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
            dsa_compat.save_dsa_kv(self, layer, fb, k, k_rope)
        lists = topk_indices if self.use_fused_topk else physical_lists(topk_indices, dsa_compat.dsa_page_table_1(self))
        return self.kgen.attend(q, q_rope, compat.key_buffer(self, layer), lists, self._kgen_tree)
