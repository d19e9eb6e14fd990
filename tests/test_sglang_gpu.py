"""The SGLang backend's kgen path on the GPU, fed exactly as SGLang 0.5.23's Triton backend is fed
for TARGET_VERIFY on an absorbed-MLA model, against SGLang's own Triton extend_attention_fwd.

Per batch: a page-size-1 KV pool ([slots, 1, 576] bf16, slot 0 reserved, unused slots NaN),
req_to_token rows at random request-pool indices pointing at scattered slots, prefix lengths
seq_lens, N draft tokens per request with q [B*N, H, 576], k [B*N, 1, 576], v = k[..., :512], and
SGLang's custom_mask (per request a row-major [N, L + N] bool block, prefix columns True).
kv_indices are gathered by SGLang's own create_flashinfer_kv_indices_triton (what the backend's
kv_index_translator.pack_read_stream launches on a plain pool) — int64 for Triton as the Triton
backend allocates them, int32 for kgen as KgenAttnBackend does. The kgen side is KgenMLA and the
prepared step, what KgenAttnBackend runs per layer; tests/test_sglang_backend_gpu.py runs the
backend class itself against SGLang's TritonAttnBackend.

The SGLang files are loaded without importing the sglang package: bench/baseline.py finds and
loads extend_attention.py (env KGEN_SGLANG_EXTEND_ATTENTION, an installed sglang, or
.sglang_whl/), and kv_indices.py is taken from the same place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.integrations.sglang_mla import KgenMLA
from kgen.reference import prefix_attention_ref
from kgen.accuracy import FP8_O_TOL

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.baseline import ENV, REL_PATHS, BaselineError, load_extend_attention  # noqa: E402
from test_defrag_planner import HISTORIES, FakePool, replay  # noqa: E402
from test_sglang_meta import MAX_CTX, Batch, random_lens, rel_l2  # noqa: E402

pytestmark = pytest.mark.gpu

SPEC = "glm5_sm120"  # H = 8, D = 576, Dv = 512, scale 0.0625, max_nodes 64, page size 1
KV_INDICES = "sglang/kernels/ops/attention/kv_indices.py"
MIN_BATCHES = 50


def _sglang_file(extend_path: str, rel: str) -> Path:
    """`rel` of the sglang copy extend_attention.py came from: beside it, in the same folder tree,
    or in an sglang wheel (env KGEN_SGLANG_EXTEND_ATTENTION, or .sglang_whl/)."""
    cands = [Path(extend_path).parent / Path(rel).name]
    cands += [Path(extend_path.removesuffix(r)) / rel for r in REL_PATHS if extend_path.endswith(r)]
    for cand in cands:
        if cand.is_file():
            return cand
    env = Path(os.environ.get(ENV) or REPO / ".sglang_whl")
    wheels = [env] if env.suffix == ".whl" else sorted(env.glob("sglang-*.whl")) if env.is_dir() else []
    for wheel in wheels + sorted((REPO / ".sglang_whl").glob("sglang-*.whl")):
        with zipfile.ZipFile(wheel) as z:
            if rel in z.namelist():
                dest = Path(tempfile.mkdtemp(prefix="kgen_sglang_")) / Path(rel).name
                dest.write_bytes(z.read(rel))
                return dest
    raise BaselineError(f"{rel} is not beside {extend_path} nor in an sglang wheel")


@pytest.fixture(scope="module")
def sglang(cuda):
    """(extend_attention_fwd, create_flashinfer_kv_indices_triton) of sglang 0.5.23."""
    try:
        extend, path = load_extend_attention()
        spec = importlib.util.spec_from_file_location("kgen_test_sglang_kv_indices", _sglang_file(path, KV_INDICES))
        kv_indices = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kv_indices)
    except (BaselineError, ImportError) as e:
        pytest.skip(f"SGLang's Triton kernels are not available here: {e}")
    return extend, kv_indices.create_flashinfer_kv_indices_triton


@pytest.fixture(scope="module")
def core(module_for):
    return KgenMLA(module_for(SPEC), max_context_len=MAX_CTX)


def triton_verify(batch: Batch, extend, gather, core: KgenMLA, kv_scale: float = 1.0) -> torch.Tensor:
    """TritonAttnBackend.forward_extend's extend_attention_fwd call for TARGET_VERIFY on an MLA
    layer, with the metadata its init_forward_metadata builds (kv_indices int64, mask_indptr);
    kv_scale is the layer's k_scale = v_scale (its k_descale, v_descale)."""
    dev, bs, n = core.device, batch.seq_lens.numel(), batch.n
    qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=dev)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
    kv_indptr[1:] = torch.cumsum(batch.seq_lens, 0)
    kv_indices = torch.empty(max(1, int(batch.seq_lens.sum())), dtype=torch.int64, device=dev)
    batch.fill(gather)(kv_indptr, kv_indices)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
    mask_indptr[1:] = torch.cumsum(n * (batch.seq_lens + n), 0)
    o = torch.empty(bs * n, core.heads, core.vdim, dtype=torch.bfloat16, device=dev)
    v = batch.k[..., :core.vdim]
    extend(batch.q, batch.k.contiguous(), v.contiguous(), o, batch.pool, batch.pool[..., :core.vdim], qo_indptr,
           kv_indptr, kv_indices, batch.custom_mask, True, mask_indptr, n, kv_scale, kv_scale, core.scale, logit_cap=0.0,
           sliding_window_size=-1, sinks=None, window_kv_offsets=None, xai_temperature_len=-1, page_size=1,
           score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None)
    return o


def test_verify_matches_sglang_triton_on_random_batches(core, sglang, seed):
    extend, gather = sglang
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for i in range(MIN_BATCHES):
        bs = int(torch.randint(1, 9, (1,), generator=gen))
        n = [1, 4, 16, 33, 64][i % 5]
        batch = Batch(core, random_lens(gen, bs, [40, 700, 3000][i % 3]), n, gen, chain=(i % 7 == 3))
        got, want = batch.kgen(core, gather), triton_verify(batch, extend, gather, core)
        assert not torch.isnan(got).any(), f"batch {i}: kgen wrote NaN (read an unused slot?)"
        err = rel_l2(got, want)
        worst = max(worst, err)
        assert err <= 1e-2, f"batch {i} (bs {bs}, N {n}, lens {batch.seq_lens.tolist()}): rel L2 {err:.3g}"
    print(f"worst rel L2 over {MIN_BATCHES} batches: {worst:.3g}")


@pytest.mark.parametrize("bs,n", [(1, 16), (4, 8), (8, 64)])
def test_verify_graph_capture_replays_changed_inputs(core, sglang, seed, bs, n):
    """SGLang's CUDA-graph protocol: init_cuda_graph_state once, then per step the metadata is
    written into the same buffers (out_graph) and the captured kernels replay. Each replay has new
    lengths, slots, trees, queries and a padded lane when the real batch is smaller."""
    extend, gather = sglang
    gen = torch.Generator().manual_seed(seed)
    core.init_graph(max_bs=8)
    dev, h, d = core.device, core.heads, core.dim
    num_slots = 8 * MAX_CTX
    static = dict(q=torch.zeros(bs * n, h, d, dtype=torch.bfloat16, device=dev),
                  k=torch.zeros(bs * n, 1, d, dtype=torch.bfloat16, device=dev),
                  seq_lens=torch.ones(bs, dtype=torch.int64, device=dev),
                  rows=torch.zeros(bs, dtype=torch.int64, device=dev),
                  mask=torch.zeros(bs * n * (MAX_CTX + n), dtype=torch.uint8, device=dev),  # the verify mask buffer
                  out=torch.zeros(bs * n, h * core.vdim, dtype=torch.bfloat16, device=dev))
    pool = torch.zeros(num_slots + 1, 1, d, dtype=torch.bfloat16, device=dev)
    req_to_token = torch.zeros(2 * bs + 1, MAX_CTX, dtype=torch.int32, device=dev)

    def load(batch: Batch, real: int):
        """What the graph runner and Triton's out_graph do before a replay (padded lanes: seq 1, row 0)."""
        pool.copy_(batch.pool)
        req_to_token.zero_()
        req_to_token[:batch.req_to_token.shape[0]].copy_(batch.req_to_token)
        static["q"][:real * n].copy_(batch.q)
        static["k"][:real * n].copy_(batch.k)
        static["seq_lens"].fill_(1)
        static["seq_lens"][:real].copy_(batch.seq_lens)
        static["rows"].zero_()
        static["rows"][:real].copy_(batch.rows)
        static["mask"][:batch.custom_mask.numel()].copy_(batch.custom_mask)
        batch.req_to_token = req_to_token
        return core.plan(static["seq_lens"], batch.fill(gather, static["rows"], static["seq_lens"]),
                         tokens_per_req=n, verify=True, custom_mask=static["mask"], graph=True)

    first = Batch(core, random_lens(gen, bs, 1000), n, gen, num_slots=num_slots)
    prepared = core.prepare(load(first, bs), bs * n)  # the buffers are refilled in place before each replay

    def step():
        prepared.verify(static["q"], pool, static["k"].view(-1, d), out=static["out"].view(-1, h, core.vdim))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for r in range(17):
        real = bs if r % 3 or bs == 1 else bs - 1
        batch = Batch(core, random_lens(gen, real, [50, 900, MAX_CTX - n][r % 3]), n, gen, num_slots=num_slots)
        want = triton_verify(batch, extend, gather, core)
        load(batch, real)
        static["out"].fill_(float("nan"))
        graph.replay()
        got = static["out"][:real * n].view(-1, h, core.vdim)
        assert not torch.isnan(got).any(), f"replay {r}: NaN in the output"
        err = rel_l2(got, want)
        assert err <= 1e-2, f"replay {r} (real {real} of {bs}, lens {batch.seq_lens.tolist()}): rel L2 {err:.3g}"


def test_decode_matches_the_reference(core, sglang, seed):
    """Decode (one query token per request, seq_lens counting it) runs kgen's prefix_attention."""
    _, gather = sglang
    gen = torch.Generator().manual_seed(seed)
    for i in range(10):
        bs = int(torch.randint(1, 17, (1,), generator=gen))
        lens = [max(1, x) for x in random_lens(gen, bs, [30, 2000][i % 2])]
        batch = Batch(core, lens, 1, gen)
        meta = core.plan(batch.seq_lens, batch.fill(gather), tokens_per_req=1, verify=False,
                         capacity=int(batch.seq_lens.sum()))
        got = torch.full((bs, core.heads, core.vdim), float("nan"), dtype=torch.bfloat16, device=core.device)
        core.prepare(meta, bs).prefix(batch.q, batch.pool, out=got)
        want, _ = prefix_attention_ref(batch.q, batch.pool.view(-1, core.dim), meta.qo_indptr, meta.kv_indptr,
                                       meta.kv_indices, meta.kv_lens, 1, core.scale, core.vdim)
        err = rel_l2(got, want)
        assert err <= 1e-2, f"decode batch {i} (lens {lens}): rel L2 {err:.3g}"


@pytest.mark.parametrize("k_scale", [1.0, 0.375])
def test_an_fp8_pool_is_read_as_sglangs_triton_reads_it(module_for, sglang, seed, k_scale):
    """An fp8 pool as SGLang's MLA pool holds it (e4m3(k / k_scale)) and the layer's k_scale: kgen's
    verify and decode against the float64 meaning of the stored bytes (fp8 tolerance), and verify
    against SGLang's Triton extend_attention_fwd on the same pool and scales."""
    extend, gather = sglang
    core = KgenMLA(module_for("glm5_fp8_sm120"), max_context_len=MAX_CTX)
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for i in range(6):
        bs, n = int(torch.randint(1, 6, (1,), generator=gen)), [4, 16, 64][i % 3]
        batch = Batch(core, random_lens(gen, bs, [300, 3000][i % 2]), n, gen)
        batch.to_fp8(k_scale)
        got = batch.kgen(core, gather, k_scale)
        assert not torch.isnan(got).any(), f"batch {i}: kgen wrote NaN"
        err, vs_triton = rel_l2(got, batch.fp8_ref(core)), rel_l2(got, triton_verify(batch, extend, gather, core, k_scale))
        worst = max(worst, err)
        assert err <= FP8_O_TOL and vs_triton <= 2 * FP8_O_TOL, f"batch {i}: rel L2 {err:.3g}, vs Triton {vs_triton:.3g}"
    print(f"fp8 verify, k_scale {k_scale}: worst rel L2 {worst:.3g} against the float64 meaning of the bytes")
    decode = Batch(core, [max(1, x) for x in random_lens(gen, 7, 2000)], 1, gen)
    decode.to_fp8(k_scale)
    meta = core.plan(decode.seq_lens, decode.fill(gather), tokens_per_req=1, verify=False,
                     capacity=int(decode.seq_lens.sum()))
    got = torch.full((7, core.heads, core.vdim), float("nan"), dtype=torch.bfloat16, device=core.device)
    core.prepare(meta, 7).prefix(decode.q, decode.pool, kv_scale=k_scale, out=got)
    want, _ = prefix_attention_ref(decode.q, decode.pool.view(-1, core.dim), meta.qo_indptr, meta.kv_indptr,
                                   meta.kv_indices, meta.kv_lens, 1, core.scale, core.vdim, kv_scale=k_scale)
    assert rel_l2(got, want) <= FP8_O_TOL


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(history=HISTORIES, seed=st.integers(0, 2**31 - 1), num_slots=st.integers(2, 400))
def test_defrag_apply_on_the_gpu_keeps_every_row_and_the_free_list_exact(module_for, history, seed, num_slots):
    """tests/test_defrag_planner.py's histories, with SGLang-shaped per-layer KV buffers on the GPU
    and kgen's kv_defrag (one launch for all layers) as the move."""
    mod = module_for(SPEC)
    layers = [torch.zeros(num_slots, 1, 576, dtype=torch.bfloat16, device=mod.device) for _ in range(5)]
    replay(history, FakePool(num_slots, layers, seed),
           lambda src, dst: mod.defrag(layers, src.to(mod.device), dst.to(mod.device)))
