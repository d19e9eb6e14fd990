"""KgenMLA.plan — the part of the SGLang backend that turns what SGLang's Triton backend is given
(seq_lens, req_to_token rows, SGLang's flat custom_mask) into kgen's inputs — checked on the CPU:
kgen's reference attention over the planned inputs equals attention computed straight from
SGLang's layout (what extend_attention_fwd computes for TARGET_VERIFY), eagerly and through the
CUDA-graph buffers. `Batch` is shared with tests/test_sglang_gpu.py, which feeds the same tensors
to SGLang's Triton kernel and to kgen's kernels.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

import kgen
from kgen import fp8
from kgen.integrations.sglang import KgenMLA
from kgen.mask import mask_from_parents, unpack_bits
from kgen.reference import prefix_attention_ref, verify_attention_ref
from kgen.testing import tree_parents

MAX_CTX = 4096  # the model's context length: req_to_token's width
SPEC = Path(__file__).resolve().parents[1] / "specs" / "glm5_sm120.yaml"
FP8_SPEC = SPEC.with_name("glm5_fp8_sm120.yaml")  # the same model, e4m3 cache


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def random_lens(gen: torch.Generator, bs: int, longest: int) -> list[int]:
    lens = torch.randint(0, longest + 1, (bs,), generator=gen)
    lens[torch.rand(bs, generator=gen) < 0.15] = 0
    return lens.tolist()


class Batch:
    """One TARGET_VERIFY step in SGLang's own tensors: a page-size-1 pool [slots, 1, 576] bf16
    (slot 0 reserved and zero, unused slots NaN), req_to_token rows at random request-pool indices
    pointing at scattered slots, seq_lens (prefix lengths), N draft tokens per request (q [B*N, H,
    576], k [B*N, 1, 576], v = k[..., :512]) and the flat custom_mask (per request a row-major
    [N, L + N] bool block, prefix columns True) — or None for a chain, where Triton runs causal."""

    def __init__(self, core: KgenMLA, lens: list[int], n: int, gen: torch.Generator, *, chain: bool = False,
                 num_slots: int | None = None):
        dev, h, d = core.device, core.heads, core.dim
        bs = len(lens)
        num_slots = num_slots or max(2 * sum(lens), 64)
        self.pool = torch.full((num_slots + 1, 1, d), float("nan"), dtype=torch.bfloat16, device=dev)
        self.pool[0] = 0  # SGLang's padding slot
        slots = (torch.randperm(num_slots, generator=gen) + 1)[:sum(lens)]
        self.req_to_token = torch.zeros(2 * bs + 1, MAX_CTX, dtype=torch.int32, device=dev)
        self.rows = (torch.randperm(2 * bs, generator=gen) + 1)[:bs].to(dev)
        starts = [0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()]
        for b, row in enumerate(self.rows.tolist()):
            self.req_to_token[row, :lens[b]] = slots[starts[b]:starts[b] + lens[b]].to(dev, torch.int32)
        self.pool[slots.to(dev)] = torch.randn(slots.numel(), 1, d, generator=gen).to(dev, torch.bfloat16)
        self.seq_lens = torch.tensor(lens, dtype=torch.int64, device=dev)
        self.n = n
        self.q = torch.randn(bs * n, h, d, generator=gen).to(dev, torch.bfloat16)
        self.k = torch.randn(bs * n, 1, d, generator=gen).to(dev, torch.bfloat16)
        parents = tree_parents("chain" if chain else "random", bs, n, generator=gen, device="cpu").to(dev)
        self.tree = unpack_bits(mask_from_parents(parents, words=(n + 31) // 32), n).view(bs, n, n)
        blocks = [torch.cat([torch.ones(n, length, dtype=torch.bool, device=dev), self.tree[b]], 1).flatten()
                  for b, length in enumerate(lens)]
        self.custom_mask = None if chain else torch.cat(blocks)

    def fill(self, gather=None, rows=None, seq_lens=None):
        """The backend's fill: each request's req_to_token slots into kv_indices at kv_indptr —
        with SGLang's create_flashinfer_kv_indices_triton (`gather`), or in torch on the CPU."""
        rows = self.rows if rows is None else rows
        seq_lens = self.seq_lens if seq_lens is None else seq_lens

        def fill(kv_indptr, out):
            if gather is not None:
                gather[(seq_lens.numel(), 1)](self.req_to_token, rows, seq_lens, kv_indptr, None, out,
                                              self.req_to_token.stride(0), ENTRY_PAGE_SIZE=1,
                                              TOKEN_BLOCK_PARALLEL=False, token_mapping=None)
                return
            for b, (row, n) in enumerate(zip(rows.tolist(), seq_lens.tolist())):
                start = int(kv_indptr[b])
                out[start:start + n] = self.req_to_token[row, :n].to(out.dtype)
        return fill

    def extend_ref(self, core: KgenMLA) -> torch.Tensor:
        """What extend_attention_fwd computes for this step, in float64, from SGLang's layout."""
        n, outs, at = self.n, [], 0
        for b, (row, length) in enumerate(zip(self.rows.tolist(), self.seq_lens.tolist())):
            keys = torch.cat([self.pool[self.req_to_token[row, :length].long(), 0], self.k[b * n:(b + 1) * n, 0]])
            visible = torch.ones(n, length + n, dtype=torch.bool, device=keys.device)
            if self.custom_mask is None:
                visible[:, length:] = torch.ones(n, n, dtype=torch.bool, device=keys.device).tril()
            else:  # skip_prefix_custom_mask: the prefix columns are not read
                visible[:, length:] = self.custom_mask[at:at + n * (length + n)].view(n, length + n)[:, length:]
            at += n * (length + n)
            logits = torch.einsum("nhd,kd->nhk", self.q[b * n:(b + 1) * n].double(), keys.double()) * core.scale
            p = torch.softmax(logits.masked_fill(~visible[:, None, :], float("-inf")), -1)
            outs.append(torch.einsum("nhk,kd->nhd", p, keys[:, :core.vdim].double()))
        return torch.cat(outs)

    def kgen(self, core: KgenMLA, gather, kv_scale: float = 1.0) -> torch.Tensor:
        """KgenAttnBackend's eager TARGET_VERIFY: plan from the same tensors, then verify."""
        meta = core.plan(self.seq_lens, self.fill(gather), tokens_per_req=self.n, verify=True,
                         custom_mask=self.custom_mask, capacity=max(1, int(self.seq_lens.sum())))
        out = torch.full((self.q.shape[0], core.heads * core.vdim), float("nan"), dtype=torch.bfloat16,
                         device=core.device)
        return core.verify(self.q.view(self.q.shape[0], -1), self.k, self.pool, meta, out, kv_scale).view(
            -1, core.heads, core.vdim)

    def to_fp8(self, kv_scale: float) -> None:
        """The pool as SGLang's fp8 MLA pool holds it: e4m3(row / kv_scale). See fp8_ref."""
        self.pool = fp8.quantize(self.pool, kv_scale)
        self.kv_scale = kv_scale

    def fp8_ref(self, core: KgenMLA) -> torch.Tensor:
        """extend_ref of what an fp8 pool's bytes mean (times kv_scale), with the tree keys
        quantized as kgen reads them."""
        stored, k = self.pool, self.k
        self.pool = fp8.dequantize(stored, self.kv_scale)
        self.k = fp8.dequantize(fp8.quantize(k, self.kv_scale), self.kv_scale)
        try:
            return self.extend_ref(core)
        finally:
            self.pool, self.k = stored, k


@pytest.fixture(scope="module")
def core():
    spec = kgen.load_spec(SPEC)  # H 8, max_nodes 64, page size 1
    return KgenMLA(types.SimpleNamespace(spec=spec, device=torch.device("cpu")), max_context_len=MAX_CTX)


def planned_ref(core: KgenMLA, batch: Batch, meta) -> torch.Tensor:
    """kgen's reference verify attention over the planned inputs."""
    o, _ = verify_attention_ref(batch.q, batch.pool.view(-1, core.dim), batch.k.view(-1, core.dim), meta.qo_indptr,
                                meta.kv_indptr, meta.kv_indices, meta.kv_lens, meta.tree_mask, 1, core.scale,
                                core.vdim)
    return o


@pytest.mark.parametrize("chain", [False, True])
def test_planned_inputs_mean_what_sglangs_verify_metadata_means(core, seed, chain):
    gen = torch.Generator().manual_seed(seed)
    for i in range(12):
        bs, n = int(torch.randint(1, 6, (1,), generator=gen)), [1, 5, 16, 33, 64][i % 5]
        batch = Batch(core, random_lens(gen, bs, 200), n, gen, chain=chain)
        meta = core.plan(batch.seq_lens, batch.fill(), tokens_per_req=n, verify=True, custom_mask=batch.custom_mask,
                         capacity=max(1, int(batch.seq_lens.sum())))
        assert meta.tree_mask.shape == (bs * n, core.words) and meta.kv_indices.dtype == torch.int32
        assert rel_l2(planned_ref(core, batch, meta), batch.extend_ref(core)) < 1e-9


def test_graph_plans_write_the_same_inputs_into_stable_buffers(core, seed):
    gen = torch.Generator().manual_seed(seed)
    core.init_graph(max_bs=6)
    addresses = None
    for i in range(6):
        real, n = [6, 5, 1][i % 3], 16
        batch = Batch(core, random_lens(gen, real, 300), n, gen)
        mask_buffer = torch.zeros(6 * n * (MAX_CTX + n), dtype=torch.uint8)  # SGLang's verify mask buffer
        mask_buffer[:batch.custom_mask.numel()] = batch.custom_mask
        seq_lens, rows = torch.ones(6, dtype=torch.int64), torch.zeros(6, dtype=torch.int64)  # padded lanes
        seq_lens[:real], rows[:real] = batch.seq_lens, batch.rows
        meta = core.plan(seq_lens, batch.fill(rows=rows, seq_lens=seq_lens), tokens_per_req=n, verify=True,
                         custom_mask=mask_buffer, graph=True)
        now = [t.data_ptr() for t in (meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_lens, meta.tree_mask)]
        assert addresses in (None, now)
        addresses = now
        eager = core.plan(batch.seq_lens, batch.fill(), tokens_per_req=n, verify=True, custom_mask=batch.custom_mask,
                          capacity=max(1, int(batch.seq_lens.sum())))
        assert torch.equal(meta.tree_mask[:real * n], eager.tree_mask)
        assert torch.equal(meta.kv_lens[:real], eager.kv_lens)
        assert torch.equal(meta.kv_indptr[:real + 1], eager.kv_indptr)
        total = int(eager.kv_indptr[-1])
        assert torch.equal(meta.kv_indices[:total], eager.kv_indices[:total])


def test_decode_plans_no_tree_and_one_query_per_request(core, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = Batch(core, [5, 0, 17], 1, gen)
    meta = core.plan(batch.seq_lens, batch.fill(), tokens_per_req=1, verify=False, capacity=22)
    assert meta.tree_mask is None and meta.qo_indptr.tolist() == [0, 1, 2, 3]
    assert meta.kv_indptr.tolist() == [0, 5, 5, 22] and meta.kv_lens.tolist() == [5, 0, 17]


def test_more_draft_tokens_than_the_spec_holds_is_an_error(core, seed):
    batch = Batch(core, [3], 2, torch.Generator().manual_seed(seed))
    with pytest.raises(ValueError, match="max_nodes"):
        core.plan(batch.seq_lens, batch.fill(), tokens_per_req=65, verify=True)


# ---- KgenAttnBackend's own methods, on the CPU ------------------------------------------------------
# The class needs SGLang's TritonAttnBackend and a model runner; here its kgen methods sit in front of
# a small stand-in that records what would have gone to Triton, and kgen's ops are the reference.


class RefModule:
    """kgen.jit's ops, computed by kgen.reference (CPU). An fp8 spec's ops quantize bf16 tree keys
    with kv_scale, as kgen's do."""

    def __init__(self, spec):
        self.spec, self.device = spec, torch.device("cpu")
        m = spec.model
        self.args = (1, m.softmax_scale, m.value_dim)
        self.calls: list[tuple[str, float]] = []  # (op, kv_scale)

    def verify_attention(self, q, kv_cache, k_tree, qo, kv_indptr, kv_indices, kv_lens, tree_mask, *, kv_scale,
                         out):
        self.calls.append(("verify", kv_scale))
        if self.spec.cache.kv_dtype == "float8_e4m3fn":
            k_tree = fp8.dequantize(fp8.quantize(k_tree, kv_scale), kv_scale)
        out.copy_(verify_attention_ref(q, kv_cache.view(kv_cache.shape[0], -1), k_tree, qo, kv_indptr, kv_indices,
                                       kv_lens, tree_mask, *self.args, kv_scale=kv_scale)[0])

    def prefix_attention(self, q, kv_cache, qo, kv_indptr, kv_indices, kv_lens, *, kv_scale, out):
        self.calls.append(("prefix", kv_scale))
        out.copy_(prefix_attention_ref(q, kv_cache.view(kv_cache.shape[0], -1), qo, kv_indptr, kv_indices, kv_lens,
                                       *self.args, kv_scale=kv_scale)[0])


class TritonStandIn:
    """What KgenAttnBackend inherits and calls from TritonAttnBackend."""

    def init_forward_metadata(self, fb):
        self.forward_metadata = types.SimpleNamespace(custom_mask=getattr(fb.spec_info, "custom_mask", None))

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self._verify_mask = types.SimpleNamespace(buffer=torch.zeros(max_bs * 64 * (MAX_CTX + 64), dtype=torch.uint8))

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        if fb.spec_info is not None and fb.spec_info.custom_mask is not None:
            self._verify_mask.buffer[:fb.spec_info.custom_mask.numel()] = fb.spec_info.custom_mask

    def _target_verify_num_tokens_per_req(self, spec_info):
        return spec_info.num_tokens_per_req

    def forward_extend(self, *args, **kwargs):
        self.to_triton.append("extend")

    def forward_decode(self, *args, **kwargs):
        self.to_triton.append("decode")


def backend_for(batch: Batch, spec: Path = SPEC):
    from kgen.integrations.sglang import _KgenMethods

    cls = type("KgenAttnBackend", (_KgenMethods, TritonStandIn), {})
    b = object.__new__(cls)  # SGLang's __init__ needs a model runner
    b.kgen = KgenMLA(RefModule(kgen.load_spec(spec)), max_context_len=MAX_CTX)
    b.to_triton, b._kgen_meta, b.token_to_kv_pool = [], None, types.SimpleNamespace(get_key_buffer=lambda i: batch.pool)
    b.kv_index_translator = types.SimpleNamespace(
        pack_read_stream=lambda plan, *, req_pool_indices, seq_lens, indptr, out:
        batch.fill(rows=req_pool_indices, seq_lens=seq_lens)(indptr, out))
    b._defrag = types.SimpleNamespace(maybe_run=lambda fb: None)  # needs SGLang's allocator; see test_defrag_planner
    return b


def forward_batch(batch: Batch, mode: str):
    verify = mode == "verify"
    fm = types.SimpleNamespace(is_target_verify=lambda: verify, is_decode=lambda: not verify)
    spec_info = types.SimpleNamespace(custom_mask=batch.custom_mask, num_tokens_per_req=batch.n) if verify else None
    return types.SimpleNamespace(forward_mode=fm, spec_info=spec_info, req_pool_indices=batch.rows,
                                 seq_lens=batch.seq_lens, seq_lens_sum=int(batch.seq_lens.sum()),
                                 batch_size=batch.seq_lens.numel(), kv_loc_plan=None)


def mla_layer(core: KgenMLA, **changes):
    layer = dict(layer_id=0, qk_head_dim=core.dim, v_head_dim=core.vdim, tp_q_head_num=core.heads, tp_k_head_num=1,
                 scaling=core.scale, k_scale=None, v_scale=None, logit_cap=0.0, sliding_window_size=-1)
    return types.SimpleNamespace(**{**layer, **changes})


def scaled(k_scale: float, v_scale: float | None = None) -> dict:
    """A RadixAttention's checkpoint KV scales (tensors, and their floats as SGLang keeps them)."""
    v_scale = k_scale if v_scale is None else v_scale
    return dict(k_scale=torch.tensor(k_scale), v_scale=torch.tensor(v_scale), k_scale_float=k_scale,
                v_scale_float=v_scale)


@pytest.mark.parametrize("graph", [False, True])
def test_the_backend_runs_verify_through_kgen_and_other_layers_through_triton(seed, graph):
    gen = torch.Generator().manual_seed(seed)
    for i in range(4):
        batch = Batch(KgenMLA(RefModule(kgen.load_spec(SPEC)), MAX_CTX), random_lens(gen, 3, 150), 16, gen,
                      chain=i == 3)
        b = backend_for(batch)
        fb = forward_batch(batch, "verify")
        if graph:
            b.init_cuda_graph_state(4, 64)
            b.init_forward_metadata_out_graph(fb, in_capture=True)
        else:
            b.init_forward_metadata(fb)
        core = b.kgen
        q, k = batch.q.view(batch.q.shape[0], -1), batch.k
        o = b.forward_extend(q, k, k[..., :core.vdim], mla_layer(core), fb, save_kv_cache=False)
        assert o.shape == (q.shape[0], core.heads * core.vdim) and not b.to_triton
        assert rel_l2(o.view(-1, core.heads, core.vdim), batch.extend_ref(core)) < 1e-2
        for other in (dict(logit_cap=30.0), dict(k_scale=torch.ones(1)), dict(tp_q_head_num=16),
                      dict(sliding_window_size=128)):
            b.forward_extend(q, k, k[..., :core.vdim], mla_layer(core, **other), fb, save_kv_cache=False)
        assert b.to_triton == ["extend"] * 4


def test_the_backend_runs_plain_decode_through_kgen(seed):

    gen = torch.Generator().manual_seed(seed)
    batch = Batch(KgenMLA(RefModule(kgen.load_spec(SPEC)), MAX_CTX), [7, 1, 90], 1, gen)
    b = backend_for(batch)
    fb = forward_batch(batch, "decode")
    b.init_forward_metadata(fb)
    core = b.kgen
    o = b.forward_decode(batch.q.view(3, -1), batch.k, batch.k[..., :core.vdim], mla_layer(core), fb,
                         save_kv_cache=False)
    want, _ = prefix_attention_ref(batch.q, batch.pool.view(-1, core.dim), b._kgen_meta.qo_indptr,
                                   b._kgen_meta.kv_indptr, b._kgen_meta.kv_indices, b._kgen_meta.kv_lens, 1,
                                   core.scale, core.vdim)
    assert rel_l2(o.view(3, core.heads, core.vdim), want) < 1e-2 and not b.to_triton
    fb.spec_info = object()  # a draft's multi-step decode: Triton's
    b.init_forward_metadata(fb)
    b.forward_decode(batch.q.view(3, -1), batch.k, batch.k[..., :core.vdim], mla_layer(core), fb, save_kv_cache=False)
    assert b.to_triton == ["decode"]


@pytest.mark.parametrize("k_scale", [None, 0.375])
def test_an_fp8_cache_is_read_with_the_layers_k_scale(seed, k_scale):
    """SGLang's fp8 MLA cache holds e4m3(k / k_scale) (a plain cast without a scale) and is read back
    times k_scale; the tree tokens' k arrives unscaled in bf16."""
    gen = torch.Generator().manual_seed(seed)
    module = RefModule(kgen.load_spec(FP8_SPEC))
    batch = Batch(KgenMLA(module, MAX_CTX), random_lens(gen, 3, 150), 16, gen)
    scale = 1.0 if k_scale is None else k_scale
    batch.to_fp8(scale)
    want = batch.fp8_ref(KgenMLA(module, MAX_CTX))
    b = backend_for(batch, FP8_SPEC)
    fb = forward_batch(batch, "verify")
    b.init_forward_metadata(fb)
    core = b.kgen
    layer = mla_layer(core, **({} if k_scale is None else scaled(k_scale)))
    q = batch.q.view(batch.q.shape[0], -1)
    o = b.forward_extend(q, batch.k, batch.k[..., :core.vdim], layer, fb, save_kv_cache=False)
    assert b.kgen.module.calls == [("verify", scale)] and not b.to_triton
    assert rel_l2(o.view(-1, core.heads, core.vdim), want) < 1e-2
    if k_scale is not None:  # one scale for the one latent row: a different v_scale is Triton's
        b.forward_extend(q, batch.k, batch.k[..., :core.vdim], mla_layer(core, **scaled(k_scale, 2 * k_scale)), fb,
                         save_kv_cache=False)
        assert b.to_triton == ["extend"]


def test_a_bf16_cache_with_kv_scales_is_tritons():
    core = KgenMLA(RefModule(kgen.load_spec(SPEC)), MAX_CTX)
    assert core.kv_scale(mla_layer(core)) == 1.0
    assert core.kv_scale(mla_layer(core, **scaled(0.5))) is None
    fp8_core = KgenMLA(RefModule(kgen.load_spec(FP8_SPEC)), MAX_CTX)
    assert fp8_core.kv_scale(mla_layer(fp8_core, **scaled(0.5))) == 0.5
    assert fp8_core.kv_scale(mla_layer(fp8_core, **scaled(float("inf")))) is None


def test_the_runtime_spec_reads_the_runners_cache_dtype(monkeypatch):
    """_kgen_for_model builds kgen's spec from the model runner: an fp8 e4m3 cache gets an fp8 spec,
    a cache dtype kgen does not read leaves every mode to Triton, with the reason."""
    from kgen.integrations import sglang as integration

    monkeypatch.setattr(kgen, "jit", lambda spec: types.SimpleNamespace(spec=spec, device=torch.device("cpu")))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(major=12, minor=0))
    monkeypatch.delenv("KGEN_SGLANG_SPEC", raising=False)
    attn = types.SimpleNamespace(qk_head_dim=576, v_head_dim=512, scaling=0.0625, tp_q_head_num=8)
    backend = types.SimpleNamespace(use_mla=True, dcp_size=1, enable_deterministic=False, sliding_window_size=0,
                                    num_draft_tokens=16, target_verify_num_tokens_per_req=None, max_context_len=MAX_CTX)

    def runner(dtype):
        return types.SimpleNamespace(kv_cache_dtype=dtype, model=types.SimpleNamespace(modules=lambda: [attn]),
                                     model_config=types.SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64))

    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float8_e4m3fn, "float8_e4m3fn")):
        core, why = integration._kgen_for_model(backend, runner(dtype))
        assert why == "" and core.module.spec.cache.kv_dtype == name
        assert core.kv_fp8 == (name == "float8_e4m3fn") and core.heads == 8 and core.max_nodes == 16
    core, why = integration._kgen_for_model(backend, runner(torch.float8_e5m2))
    assert core is None and "float8_e5m2" in why
    monkeypatch.setenv("KGEN_SGLANG_SPEC", str(SPEC))  # a bf16 spec for an fp8 cache: Triton's, and why
    core, why = integration._kgen_for_model(backend, runner(torch.float8_e4m3fn))
    assert core is None and "bfloat16" in why and "float8_e4m3fn" in why
