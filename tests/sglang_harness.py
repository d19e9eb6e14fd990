"""SGLang's real attention backends, built outside a server, for tests/test_sglang_backend.py (CPU)
and tests/test_sglang_backend_gpu.py (GPU). Needs an installed sglang; targets 0.5.23 (what CI
and the GPU script install) and bridges the few constructor differences of 0.5.21/0.5.22 it meets.

`Harness` publishes a minimal SGLang configuration (as SGLang's own attention unit-test kit
does: `override_server_args` plus a parallel override) and builds model runners: objects with
exactly what TritonAttnBackend and kgen's backend read of a ModelRunner — their own req_to_token
pool, KV pool and token allocator, KV-index translator, model config and RadixAttention layers.
Two shapes: a dense-MLA model on the plain MLA pool at page size 1 (one layer), or GLM-5
(`glm5=True`: GlmMoeDsaForCausalLM, a few layers, SGLang's DSATokenToKVPool at page size 64 with
bf16 rows or fp8 rows with per-block scales, EAGLE topk 4).
`Step` is one batch in SGLang's own terms (ForwardBatch, EagleVerifyInput for TARGET_VERIFY),
written into any number of runners with identical contents, plus its float64 reference (scaled
fp8 rows dequantized as DESIGN §11 says: latent byte × its block's scale, rope as stored).

`stand_in_missing()` registers stand-ins for what SGLang imports but this machine cannot:
torchvision (a CPU machine: its PyPI wheels need a CUDA torch; SGLang's text-model path never
calls it) and, on a CUDA machine, sgl_kernel (SGLang's compiled CUDA kernels package: the names
SGLang's modules import from it on CUDA are stand-ins that fail if called — the attention
backends call none — and TritonAttnBackend's question whether the GPU supports PDL is answered
False).
"""

from __future__ import annotations

import enum
import importlib.machinery
import inspect
import sys
import types

import torch

from kgen.reference import prefix_attention_ref, verify_attention_ref

R, P = 512, 64  # kv_lora_rank, qk_rope_head_dim: GLM-5 / DeepSeek absorbed MLA
SCALE = 0.0625
BLOCK = 128  # latent dims per scale in scaled fp8 rows
SCALED_ROW = R + R // BLOCK * 4 + P * 2  # 656 bytes: e4m3 latent | fp32 scales | bf16 rope
DSA_PAGE = 64


def stand_in_missing() -> list[str]:
    """Register stand-ins for torchvision and sgl_kernel where they cannot be imported; returns
    the names stood in for."""
    done = []
    try:
        import torchvision.transforms  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        import transformers.image_utils  # noqa: F401  (records that torchvision is absent first)
        import transformers.models.auto.processing_auto  # noqa: F401
        tv, tr, fn = (_package(n) for n in ("torchvision", "torchvision.transforms",
                                             "torchvision.transforms.functional"))
        fn.InterpolationMode = tr.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC LANCZOS")
        tv.transforms, tr.functional = tr, fn
        done.append("torchvision")
    try:
        import sgl_kernel  # noqa: F401
    except Exception:
        if not torch.cuda.is_available():  # SGLang imports sgl_kernel on CUDA only
            return done
        # quantization: scalar_type (SGLang's fallback); kvcacheio: imported by the DSA pool's modules
        for name in ("sgl_kernel", "sgl_kernel.utils", "sgl_kernel.quantization", "sgl_kernel.kvcacheio"):
            _package(name, _Absent)
        sys.modules["sgl_kernel.utils"].is_arch_support_pdl = lambda *a, **k: False
        done.append("sgl_kernel")
    return done


def gpu_ready() -> None:
    """What a GPU test of SGLang's backends does first: skip without sglang; stand in for what the
    GPU machine lacks (printed; never SGLang itself); register kgen's backend."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (bench/gpu_sglang.sh installs the carried wheels)")
    stood_in = stand_in_missing()
    print(f"stood in for: {stood_in or 'nothing'}")
    assert set(stood_in) <= {"sgl_kernel", "torchvision"}
    from kgen.integrations import sglang as integration

    integration.register()


class _Absent(types.ModuleType):
    """A module whose every public name is a stand-in that fails when used."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def absent(*args, **kwargs):
            raise NotImplementedError(f"{self.__name__}.{name} is a test stand-in ({self.__name__} is not installed)")

        absent.__name__ = name
        return absent


def _package(name: str, cls=types.ModuleType) -> types.ModuleType:
    m = cls(name)
    m.__path__, m.__spec__ = [], importlib.machinery.ModuleSpec(name, None, is_package=True)
    sys.modules[name] = m
    parent, _, leaf = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], leaf, m)
    return m


class Harness:
    """A published SGLang configuration for backends of `heads` heads and up to `max_bs`
    requests of `context_len` tokens, `draft_tokens` verify tokens per request."""

    def __init__(self, device, *, heads: int = 8, max_bs: int = 8, context_len: int = 1024, draft_tokens: int = 16,
                 glm5: bool = False, kv_dtype: torch.dtype = torch.bfloat16, layers: int = 3):
        from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
        from sglang.srt.runtime_context import get_context, get_parallel

        self.device, self.heads, self.max_bs, self.context_len = torch.device(device), heads, max_bs, context_len
        self.draft_tokens, self.glm5, self.kv_dtype = draft_tokens, glm5, kv_dtype
        self.layers = layers if glm5 else 1
        self.page_size = DSA_PAGE if glm5 else 1
        self.scaled = glm5 and kv_dtype == torch.float8_e4m3fn
        self.width = SCALED_ROW if self.scaled else R + P
        # pool size: every request can hold context_len tokens besides SGLang's padding slot (page)
        self.slots = max_bs * context_len + self.page_size
        self._server_args = get_context().override_server_args(
            attention_backend="kgen", chunked_prefill_size=-1,
            cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL),
                                              prefill=PhaseConfig(backend=Backend.DISABLED)),
            disable_radix_cache=True, dp_size=1, enable_deterministic_inference=False, kv_cache_dtype="auto",
            page_size=self.page_size, pp_size=1, speculative_algorithm=None, speculative_eagle_topk=4 if glm5 else 0,
            speculative_num_draft_tokens=draft_tokens, speculative_num_steps=draft_tokens - 1, tp_size=1,
            triton_attention_num_kv_splits=8, triton_attention_split_tile_size=None)
        self._server_args.install()
        self._parallel = get_parallel().override(attn_tp_size=1, attn_dcp_rank=0)
        self._parallel.__enter__()

    def runner(self) -> types.SimpleNamespace:
        """A model runner with its own pools (what the backends read of one, nothing more)."""
        from sglang.srt.configs.model_config import AttentionArch
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        h, dev, page = self.heads, self.device, self.page_size
        hf = types.SimpleNamespace(architectures=["GlmMoeDsaForCausalLM" if self.glm5 else "KgenTestMLAForCausalLM"])
        if self.glm5:  # what marks a DSA model (its indexer); attention stays dense on a non-DSA backend
            hf.index_topk, hf.index_head_dim, hf.index_n_heads = 2048, 128, 32
        hf.get_text_config = lambda: hf
        config = types.SimpleNamespace(
            attention_arch=AttentionArch.MLA, context_len=self.context_len, num_attention_heads=h, kv_lora_rank=R,
            qk_nope_head_dim=R, qk_rope_head_dim=P, head_dim=R + P, v_head_dim=R, swa_v_head_dim=R,
            is_encoder_decoder=False, hf_config=hf, hf_text_config=hf, linear_attn_registry_result=None,
            get_max_num_attention_heads=lambda: h, get_num_kv_heads=lambda tp, dcp=1: 1)
        req = ReqToTokenPool(size=self.max_bs, max_context_len=self.context_len, device=str(dev),
                             enable_memory_saver=False)
        if self.glm5:  # the pool SGLang gives every DSA model on CUDA (kv_cache_configurator)
            pool = DSATokenToKVPool(size=self.slots, page_size=page, kv_lora_rank=R,
                                    dtype=self.kv_dtype, qk_rope_head_dim=P, layer_num=self.layers, device=str(dev),
                                    index_head_dim=128, enable_memory_saver=False, kv_cache_dim=self.width)
        else:
            pool = MLATokenToKVPool(size=self.slots, page_size=1, dtype=torch.bfloat16,
                                    kv_lora_rank=R, qk_rope_head_dim=P, layer_num=1, device=str(dev),
                                    enable_memory_saver=False)
        allocator = TokenToKVPoolAllocator(size=self.max_bs * self.context_len, dtype=self.kv_dtype,
                                           device=str(dev), kvcache=pool, need_sort=False)
        layers = [RadixAttention(num_heads=h, head_dim=R + P, scaling=SCALE, num_kv_heads=1, layer_id=i, v_head_dim=R)
                  for i in range(self.layers)]
        runner = types.SimpleNamespace(
            device=str(dev), gpu_id=dev.index or 0, page_size=page, model_config=config, req_to_token_pool=req,
            token_to_kv_pool=pool, token_to_kv_pool_allocator=allocator, sliding_window_size=None,
            is_draft_worker=False, kv_cache_dtype=self.kv_dtype, spec_algorithm=SpeculativeAlgorithm.NONE,
            decode_num_tokens_per_req=lambda **kw: self.draft_tokens, model=torch.nn.ModuleList(layers),
            layer=layers[0], layers=layers)
        draft = {"is_draft_worker": False} if "is_draft_worker" in inspect.signature(KVIndexTranslator).parameters else {}
        runner.kv_index_translator = KVIndexTranslator(  # 0.5.21's takes no is_draft_worker
            req_to_token=req.req_to_token, token_to_kv_pool_allocator=allocator, token_to_kv_pool=pool,
            page_size=page, device=str(dev), **draft)
        return runner

    def backend(self, name: str, runner):
        """SGLang's attention backend `name`, built through SGLang's registry."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        return ATTENTION_BACKENDS[name](runner)


class Step:
    """One TARGET_VERIFY (n > 0 draft tokens per request, tree = a random tree per request) or
    DECODE (n = 0) batch: prefix lengths `lens` at slots scattered over the pool (or over its
    first `within` slots; at page size > 1, whole pages per request, as SGLang's paged allocator
    hands them out), which holds random rows in every layer."""

    def __init__(self, harness: Harness, lens: list[int], n: int, gen: torch.Generator, *, chain: bool = False,
                 within: int | None = None):
        from kgen.mask import mask_from_parents, unpack_bits
        from kgen.inputs import tree_parents

        self.h, self.lens, self.n = harness, list(lens), n
        self.verify = n > 0
        bs, per, page = len(lens), max(n, 1), harness.page_size
        new = [length + n if self.verify else length for length in lens]  # tokens in req_to_token
        num_slots = harness.max_bs * harness.context_len
        ends = torch.tensor(new).cumsum(0).tolist()
        if page == 1:
            slots = torch.randperm(within or num_slots, generator=gen)[:sum(new)] + 1  # slot 0: SGLang's padding slot
            self.rows = [slots[a - b:a] for a, b in zip(ends, new)]
        else:  # page 0 holds the padding slot
            counts = [-(-x // page) for x in new]
            pages = torch.randperm(harness.slots // page - 1, generator=gen)[:sum(counts)] + 1
            assert pages.numel() == sum(counts), f"{sum(counts)} pages do not fit the pool"
            firsts = torch.tensor(counts).cumsum(0).tolist()
            self.rows = [(pages[a - c:a, None] * page + torch.arange(page)).flatten()[:x]
                         for a, c, x in zip(firsts, counts, new)]
        self.pool = random_rows((harness.layers, harness.slots + page), gen, scaled=harness.scaled)  # the pool's rows
        self.q = torch.randn(bs * per, harness.heads, R + P, generator=gen).to(torch.bfloat16)
        self.k = torch.randn(bs * per, 1, R + P, generator=gen).to(torch.bfloat16)
        # the new tokens' slots: a verify batch's tree tokens follow the prefix; decode: the last token
        self.out_cache_loc = torch.cat([r[-per:] for r in self.rows]).long()
        self.tree = None
        if self.verify:
            parents = tree_parents("chain" if chain else "random", bs, n, generator=gen, device="cpu")
            self.tree = unpack_bits(mask_from_parents(parents, words=(n + 31) // 32), n).view(bs, n, n)
        self._stored = None

    def stored(self, device) -> torch.Tensor:
        """[T, 1, width]: the rows the pool must hold for the new tokens after the forward: k as
        given, or, in scaled fp8 rows, k as SGLang's own quantizer for that pool writes it (run
        once on `device`)."""
        if self._stored is None:
            self._stored = sglang_scaled_rows(self.k.to(device)).cpu() if self.h.scaled else self.k
        return self._stored

    def custom_mask(self) -> torch.Tensor:
        """SGLang's flat verify mask: per request a row-major [N, L + N] bool block."""
        return torch.cat([torch.cat([torch.ones(self.n, length, dtype=torch.bool), self.tree[b]], 1).flatten()
                          for b, length in enumerate(self.lens)])

    def load(self, runner) -> None:
        """Write this batch's req_to_token rows (request b in row b + 1: row 0 is SGLang's padding
        row) and KV rows into the runner's pools."""
        runner.req_to_token_pool.req_to_token.zero_()
        for b, row in enumerate(self.rows):
            runner.req_to_token_pool.req_to_token[b + 1, :row.numel()] = row.to(runner.device, torch.int32)
        for layer in range(self.h.layers):
            key_rows(runner, layer)[:self.pool.shape[1]].copy_(self.pool[layer])

    def forward_batch(self, runner, *, pad_to: int | None = None):
        """The ForwardBatch SGLang builds for this step on `runner` (optionally padded to `pad_to`
        requests the way SGLang's CUDA-graph runner pads: seq_lens 1, request row 0, slot 0)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        dev, bs, per = runner.device, len(self.lens), max(self.n, 1)
        pad = (pad_to or bs) - bs
        lens = self.lens + [1] * pad  # verify: the prefixes; decode: with the current token
        tokens = (bs + pad) * per
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY if self.verify else ForwardMode.DECODE, batch_size=bs + pad,
            input_ids=torch.zeros(tokens, dtype=torch.int64, device=dev),
            req_pool_indices=torch.tensor(list(range(1, bs + 1)) + [0] * pad, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
            out_cache_loc=torch.cat([self.out_cache_loc, torch.zeros(pad * per, dtype=torch.int64)]).to(dev),
            seq_lens_sum=sum(lens), positions=torch.zeros(tokens, dtype=torch.int64, device=dev))
        bind = getattr(runner.kv_index_translator, "bind_own_plan", None)  # sglang >= 0.5.22
        if bind is not None:
            bind(fb)
        if self.verify:
            fb.spec_info = EagleVerifyInput(
                draft_token=fb.input_ids, custom_mask=self.custom_mask().to(dev), positions=fb.positions,
                retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
                spec_steps=self.n - 1, topk=2, draft_token_num=self.n, capture_hidden_mode=CaptureHiddenMode.FULL,
                seq_lens_sum=fb.seq_lens_sum, seq_lens_cpu=fb.seq_lens_cpu)
        return fb

    def inputs(self, device, *, pad_to: int | None = None):
        """(q [T, H*576], k [T, 1, 576], v [T, 1, 512]) as DeepSeek's absorbed MLA passes them
        (padded with zero rows to `pad_to` requests, as forward_batch pads)."""
        rows = (pad_to or len(self.lens)) * max(self.n, 1) - self.q.shape[0]
        q = torch.cat([self.q, self.q.new_zeros(rows, *self.q.shape[1:])]).to(device)
        k = torch.cat([self.k, self.k.new_zeros(rows, *self.k.shape[1:])]).to(device)
        return q.view(q.shape[0], -1), k, k[..., :R]

    def reference(self, layer: int = 0, device="cpu") -> torch.Tensor:
        """[T, H, 512] float64 for `layer`: each new token attends to its prefix (and, verifying,
        the tree tokens its mask shows; decoding, the prefix includes its own row), the new tokens'
        keys as the pool stores them (scaled fp8 rows: quantized, as SGLang's DSA attention reads
        its tree tokens back from the pool)."""
        outs, pool = [], dequantized(self.pool[layer, :, 0], scaled=self.h.scaled)
        own = dequantized(self.stored(device)[:, 0], scaled=self.h.scaled)
        per = max(self.n, 1)
        for b, length in enumerate(self.lens):
            q = self.q[b * per:(b + 1) * per].double()
            if self.verify:
                keys = torch.cat([pool[self.rows[b][:length]], own[b * per:(b + 1) * per]])
                visible = torch.cat([torch.ones(self.n, length, dtype=torch.bool), self.tree[b]], 1)
            else:
                keys = torch.cat([pool[self.rows[b][:length - 1]], own[b:b + 1]])
                visible = torch.ones(1, length, dtype=torch.bool)
            logits = torch.einsum("nhd,kd->nhk", q, keys) * SCALE
            p = torch.softmax(logits.masked_fill(~visible[:, None, :], float("-inf")), -1)
            outs.append(torch.einsum("nhk,kd->nhd", p, keys[:, :R]))
        return torch.cat(outs)


class Captured:
    """`backend`'s forward of every layer of `runner`, captured in a CUDA graph as SGLang's graph
    runner does it: init_cuda_graph_state once; init_forward_metadata_out_graph(in_capture=True) on
    a batch of max_bs requests (`first`), a warm-up outside the capture, the capture. `replay(step)`:
    the step's values into the captured batch's tensors, out_graph, replay (outputs poisoned first)."""

    def __init__(self, backend, runner, first: Step, max_bs: int):
        self.backend, self.runner, self.max_bs = backend, runner, max_bs
        backend.init_cuda_graph_state(max_bs, max_bs * max(first.n, 1))
        first.load(runner)
        self.fb = first.forward_batch(runner, pad_to=max_bs)
        self.q, self.k, self.v = first.inputs(runner.device, pad_to=max_bs)
        backend.init_forward_metadata_out_graph(self.fb, in_capture=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward()  # warm up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outs = self._forward()

    def _forward(self) -> list[torch.Tensor]:
        return [self.backend.forward(self.q, self.k, self.v, layer, self.fb, save_kv_cache=True)
                for layer in self.runner.layers]

    def replay(self, step: Step) -> list[torch.Tensor]:
        """Each layer's output for `step` (padded to max_bs requests), from the captured graph."""
        step.load(self.runner)
        new = step.forward_batch(self.runner, pad_to=self.max_bs)
        for name in ("req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc", "positions"):
            getattr(self.fb, name).copy_(getattr(new, name))
        self.fb.seq_lens_sum, self.fb.spec_info = new.seq_lens_sum, new.spec_info
        self.backend.init_forward_metadata_out_graph(self.fb)
        q, k, _ = step.inputs(self.runner.device, pad_to=self.max_bs)
        self.q.copy_(q)
        self.k.copy_(k)
        for out in self.outs:
            out.fill_(float("nan"))
        self.graph.replay()
        return [out.clone() for out in self.outs]


def sglang_scaled_rows(k: torch.Tensor) -> torch.Tensor:
    """[T, 1, 656] uint8: bf16 keys [T, 1, 576] as SGLang's own writer for scaled fp8 rows stores
    them (the quantizer its pool calls, a Triton kernel: on the CPU under TRITON_INTERPRET=1; its
    module moved between releases, the pool's module names it in each)."""
    from sglang.srt.mem_cache.memory_pool import quantize_k_cache_separate

    nope, rope = quantize_k_cache_separate(k[..., :R], k[..., R:])
    return torch.cat([nope.reshape(k.shape[0], -1), rope.reshape(k.shape[0], -1)], 1).view(k.shape[0], 1, SCALED_ROW)


def key_rows(runner, layer: int) -> torch.Tensor:
    """A layer's KV rows as stored ([slots, 1, width]: bf16, or the bytes of scaled fp8 rows)."""
    rows = runner.token_to_kv_pool.get_key_buffer(layer)
    return rows.view(torch.uint8) if rows.shape[-1] == SCALED_ROW else rows


def random_rows(shape: tuple[int, ...], gen: torch.Generator, *, scaled: bool) -> torch.Tensor:
    """[*shape, 1, width] random rows: bf16, or valid scaled fp8 rows (finite e4m3 bytes, positive
    block scales of the size SGLang's quantizer writes for unit-scale data, bf16 rope)."""
    if not scaled:
        return torch.randn(*shape, 1, R + P, generator=gen).to(torch.bfloat16)
    n = int(torch.tensor(shape).prod())
    latent = torch.randint(0, 0x7F, (n, R), generator=gen, dtype=torch.uint8)  # 0x7F / 0xFF are NaN
    latent |= torch.randint(0, 2, (n, R), generator=gen, dtype=torch.uint8) << 7  # the sign bit
    scales = (torch.rand(n, R // BLOCK, generator=gen) * 0.008 + 0.002).view(torch.uint8)
    rope = torch.randn(n, P, generator=gen).to(torch.bfloat16).view(torch.uint8)
    return torch.cat([latent, scales, rope], 1).view(*shape, 1, SCALED_ROW)


def dequantized(rows: torch.Tensor, *, scaled: bool) -> torch.Tensor:
    """[N, 576] float64 values of [N, width] rows: bf16 as is; scaled fp8 rows as DESIGN §11 says
    (latent dim d = its e4m3 byte × the fp32 scale of block d // 128; rope = the bf16 values)."""
    if not scaled:
        return rows.double()
    n, s = rows.shape[0], R + R // BLOCK * 4
    latent = rows[:, :R].contiguous().view(torch.float8_e4m3fn).double().view(n, R // BLOCK, BLOCK)
    scales = rows[:, R:s].contiguous().view(torch.float32).double()
    rope = rows[:, s:].contiguous().view(torch.bfloat16).double()
    return torch.cat([(latent * scales[:, :, None]).view(n, R), rope], 1)


class RefModule:
    """kgen.jit's op module, computed by kgen.reference on the CPU (scaled fp8 rows dequantized
    first: `dequantized`; bf16 tree keys of a scaled spec quantized to such rows, as kgen's ops do);
    records its layer calls."""

    def __init__(self, spec):
        self.spec, self.device, self.calls = spec, torch.device("cpu"), []
        self.reschedules = 0  # RefStep.reschedule() calls: the graph hooks' before each replay
        m = spec.model
        self.args = (1, m.softmax_scale, m.value_dim)
        self.scaled = getattr(spec.cache, "scales", "per_tensor") == "per_block"

    def rows(self, kv_cache: torch.Tensor) -> torch.Tensor:
        rows = kv_cache.view(kv_cache.shape[0], -1)
        return dequantized(rows, scaled=True) if self.scaled else rows

    def tree_keys(self, k_tree: torch.Tensor) -> torch.Tensor:
        """bf16 keys, or the pool's stored rows of the tree's slots (what kgen's backend passes for fp8 pools)."""
        if not self.scaled:
            return k_tree
        return self.rows(k_tree if k_tree.dtype == torch.uint8 else sglang_scaled_rows(k_tree.view(-1, 1, R + P)))

    def workspace_bytes(self, num_tokens, batch):
        return 1

    def prepare(self, qo, kv_indptr, kv_indices, kv_lens, tree_mask, *, num_tokens, workspace=None):
        assert qo.numel() - 1 == kv_lens.numel() and (tree_mask is None or tree_mask.shape[0] == num_tokens)
        return RefStep(self, (qo, kv_indptr, kv_indices, kv_lens), tree_mask)

    def defrag(self, layers, src, dst):
        for layer in layers:
            layer[dst] = layer[src].clone()


class RefStep:
    """A prepared step: reads the metadata tensors at each call, as kgen's kernels do."""

    def __init__(self, mod: RefModule, prefix, tree_mask):
        self.mod, self.prefix_meta, self.tree_mask = mod, prefix, tree_mask

    def verify(self, q, kv_cache, k_tree, *, kv_scale=1.0, out=None, lse=None):
        self.mod.calls.append("verify")
        qo, kv_indptr, kv_indices, kv_lens = self.prefix_meta
        o, _ = verify_attention_ref(q, self.mod.rows(kv_cache), self.mod.tree_keys(k_tree), qo, kv_indptr,
                                    kv_indices, kv_lens, self.tree_mask, *self.mod.args, kv_scale=kv_scale)
        return out.copy_(o), None

    def reschedule(self):  # kgen's steps rewrite their schedule tables; the reference has none
        self.mod.reschedules += 1

    def prefix(self, q, kv_cache, *, kv_scale=1.0, out=None, lse=None):
        self.mod.calls.append("prefix")
        o, _ = prefix_attention_ref(q, self.mod.rows(kv_cache), *self.prefix_meta, *self.mod.args,
                                    kv_scale=kv_scale)
        return out.copy_(o), None


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu().reshape(b.shape), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
