"""KgenMLA — kgen's half of the SGLang backend, which needs no SGLang — checked on the CPU:
`plan` turns what SGLang's Triton backend is given (seq_lens, req_to_token rows, SGLang's flat
custom_mask) into kgen's inputs, and kgen's reference attention over them equals attention
computed straight from SGLang's layout (what extend_attention_fwd computes for TARGET_VERIFY),
eagerly and through the CUDA-graph buffers (padded batches included); which layers kgen serves
and with what kv_scale; how a batch is prepared. `Batch` is shared with
tests/test_sglang_gpu.py, which feeds the same tensors to SGLang's Triton kernel and to kgen's.
(tests/test_sglang_backend.py runs the whole backend class with the real SGLang.)
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

import kgen
from kgen import fp8
from kgen.integrations.sglang_mla import KgenMLA
from kgen.mask import mask_from_parents, unpack_bits
from kgen.reference import verify_attention_ref
from kgen.inputs import tree_parents

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
        """KgenAttnBackend's eager TARGET_VERIFY: plan from the same tensors, prepare, verify."""
        meta = core.plan(self.seq_lens, self.fill(gather), tokens_per_req=self.n, verify=True,
                         custom_mask=self.custom_mask, capacity=max(1, int(self.seq_lens.sum())))
        out = torch.full((self.q.shape[0], core.heads, core.vdim), float("nan"), dtype=torch.bfloat16,
                         device=core.device)
        core.prepare(meta, self.q.shape[0]).verify(self.q, self.pool, self.k.view(-1, core.dim), kv_scale=kv_scale,
                                                   out=out)
        return out

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


def fake_module(spec_path: Path):
    """What KgenMLA reads of a kgen module, without a GPU."""
    return types.SimpleNamespace(spec=kgen.load_spec(spec_path), device=torch.device("cpu"),
                                 workspace_bytes=lambda tokens, batch: 1)


@pytest.fixture(scope="module")
def core():
    return KgenMLA(fake_module(SPEC), max_context_len=MAX_CTX)  # H 8, max_nodes 64, page size 1


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


def test_a_padded_graph_batch_reads_no_mask_past_sglangs(core, seed):
    """SGLang's CUDA-graph runner pads a smaller batch (seq_lens 1, row 0) but hands over the real
    batch's custom_mask: the padded lanes must not index past it."""
    gen = torch.Generator().manual_seed(seed)
    core.init_graph(max_bs=4)
    batch = Batch(core, [7, 30], 5, gen)
    seq_lens = torch.tensor([7, 30, 1, 1])
    rows = torch.cat([batch.rows, torch.zeros(2, dtype=batch.rows.dtype)])
    meta = core.plan(seq_lens, batch.fill(rows=rows, seq_lens=seq_lens), tokens_per_req=5, verify=True,
                     custom_mask=batch.custom_mask, graph=True)
    eager = core.plan(batch.seq_lens, batch.fill(), tokens_per_req=5, verify=True, custom_mask=batch.custom_mask,
                      capacity=37)
    assert torch.equal(meta.tree_mask[:10], eager.tree_mask)


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


# ---- what kgen reads of a layer ---------------------------------------------------------------------


def mla_layer(core: KgenMLA, **changes):
    """A RadixAttention's attributes the backend reads, for the layer kgen was built for."""
    layer = dict(layer_id=0, qk_head_dim=core.dim, v_head_dim=core.vdim, tp_q_head_num=core.heads, tp_k_head_num=1,
                 scaling=core.scale, k_scale=None, v_scale=None, logit_cap=0.0, sliding_window_size=-1,
                 is_cross_attention=False, xai_temperature_len=-1)
    return types.SimpleNamespace(**{**layer, **changes})


def scaled(k_scale: float, v_scale: float | None = None) -> dict:
    """A RadixAttention's checkpoint KV scales (tensors, and their floats as SGLang keeps them)."""
    v_scale = k_scale if v_scale is None else v_scale
    return dict(k_scale=torch.tensor(k_scale), v_scale=torch.tensor(v_scale), k_scale_float=k_scale,
                v_scale_float=v_scale)




def test_kgen_serves_only_the_layer_it_was_built_for(core):
    assert core.serves(mla_layer(core))
    for other in (dict(logit_cap=30.0), dict(tp_q_head_num=16), dict(sliding_window_size=128),
                  dict(scaling=0.1), dict(tp_k_head_num=2), dict(is_cross_attention=True), dict(xai_temperature_len=8)):
        assert not core.serves(mla_layer(core, **other)), other


def test_a_layers_kv_scale_is_read_as_sglang_reads_the_cache():
    core = KgenMLA(fake_module(SPEC), MAX_CTX)
    assert core.kv_scale(mla_layer(core)) == 1.0
    assert core.kv_scale(mla_layer(core, **scaled(0.5))) is None  # scales on a bf16 cache: Triton's
    fp8_core = KgenMLA(fake_module(FP8_SPEC), MAX_CTX)
    assert fp8_core.kv_scale(mla_layer(fp8_core)) == 1.0  # an fp8 cache without scales: a plain cast
    assert fp8_core.kv_scale(mla_layer(fp8_core, **scaled(0.5))) == 0.5
    assert fp8_core.kv_scale(mla_layer(fp8_core, **scaled(0.5, 1.0))) is None  # one scale per latent row
    assert fp8_core.kv_scale(mla_layer(fp8_core, **scaled(float("inf")))) is None


def test_a_batch_is_prepared_once_with_its_token_count_and_graph_steps_share_one_workspace(seed):
    prepared = []
    module = types.SimpleNamespace(
        spec=kgen.load_spec(SPEC), device=torch.device("cpu"), workspace_bytes=lambda tokens, batch: tokens + batch,
        prepare=lambda *metadata, num_tokens, workspace: prepared.append((len(metadata), num_tokens, workspace)))
    core = KgenMLA(module, MAX_CTX)
    batch = Batch(core, [4, 9], 3, torch.Generator().manual_seed(seed))
    meta = core.plan(batch.seq_lens, batch.fill(), tokens_per_req=3, verify=True, custom_mask=batch.custom_mask,
                     capacity=13)
    core.prepare(meta, 6)
    core.init_graph(max_bs=4)
    core.prepare(meta, 6, graph=True)
    assert prepared[0] == (5, 6, None)
    assert prepared[1][:2] == (5, 6) and prepared[1][2] is core.workspace and core.workspace.numel() == 4 * 64 + 4
