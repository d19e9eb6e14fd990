"""SGLang's real attention backends, built outside a server, for tests/test_sglang_backend.py (CPU)
and tests/test_sglang_backend_gpu.py (GPU). Needs an installed sglang; targets 0.5.23 (what CI
and the GPU script install) and bridges the few constructor differences of 0.5.21/0.5.22 it meets.

`Harness` publishes a minimal SGLang configuration (as SGLang's own attention unit-test kit
does: `override_server_args` plus a parallel override) and builds model runners: objects with
exactly what TritonAttnBackend and kgen's backend read of a ModelRunner — their own req_to_token
pool, page-size-1 MLA KV pool and token allocator, KV-index translator, model config and one
RadixAttention layer.
`Step` is one batch in SGLang's own terms (ForwardBatch, EagleVerifyInput for TARGET_VERIFY),
written into any number of runners with identical contents, plus its float64 reference.

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
import sys
import types

import torch

R, P = 512, 64  # kv_lora_rank, qk_rope_head_dim: GLM-5 / DeepSeek absorbed MLA
SCALE = 0.0625


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
        for name in ("sgl_kernel", "sgl_kernel.utils", "sgl_kernel.quantization"):  # scalar_type: SGLang's fallback
            _package(name, _Absent)
        sys.modules["sgl_kernel.utils"].is_arch_support_pdl = lambda *a, **k: False
        done.append("sgl_kernel")
    return done


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

    def __init__(self, device, *, heads: int = 8, max_bs: int = 8, context_len: int = 1024, draft_tokens: int = 16):
        from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
        from sglang.srt.runtime_context import get_context, get_parallel

        self.device, self.heads, self.max_bs, self.context_len = torch.device(device), heads, max_bs, context_len
        self.draft_tokens = draft_tokens
        self._server_args = get_context().override_server_args(
            attention_backend="kgen", chunked_prefill_size=-1,
            cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL),
                                              prefill=PhaseConfig(backend=Backend.DISABLED)),
            disable_radix_cache=True, dp_size=1, enable_deterministic_inference=False, kv_cache_dtype="auto",
            pp_size=1, speculative_algorithm=None, speculative_eagle_topk=0,
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
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        h, dev = self.heads, self.device
        hf = types.SimpleNamespace(architectures=["KgenTestMLAForCausalLM"])
        hf.get_text_config = lambda: hf
        config = types.SimpleNamespace(
            attention_arch=AttentionArch.MLA, context_len=self.context_len, num_attention_heads=h, kv_lora_rank=R,
            qk_nope_head_dim=R, qk_rope_head_dim=P, head_dim=R + P, v_head_dim=R, swa_v_head_dim=R,
            is_encoder_decoder=False, hf_config=hf, hf_text_config=hf, linear_attn_registry_result=None,
            get_max_num_attention_heads=lambda: h, get_num_kv_heads=lambda tp, dcp=1: 1)
        req = ReqToTokenPool(size=self.max_bs, max_context_len=self.context_len, device=str(dev),
                             enable_memory_saver=False)
        pool = MLATokenToKVPool(size=self.max_bs * self.context_len + 1, page_size=1, dtype=torch.bfloat16,
                                kv_lora_rank=R, qk_rope_head_dim=P, layer_num=1, device=str(dev),
                                enable_memory_saver=False)
        allocator = TokenToKVPoolAllocator(size=self.max_bs * self.context_len, dtype=torch.bfloat16,
                                           device=str(dev), kvcache=pool, need_sort=False)
        layer = RadixAttention(num_heads=h, head_dim=R + P, scaling=SCALE, num_kv_heads=1, layer_id=0, v_head_dim=R)
        runner = types.SimpleNamespace(
            device=str(dev), gpu_id=dev.index or 0, page_size=1, model_config=config, req_to_token_pool=req,
            token_to_kv_pool=pool, token_to_kv_pool_allocator=allocator, sliding_window_size=None,
            is_draft_worker=False, kv_cache_dtype=torch.bfloat16, spec_algorithm=SpeculativeAlgorithm.NONE,
            decode_num_tokens_per_req=lambda **kw: self.draft_tokens, model=torch.nn.ModuleList([layer]),
            layer=layer)
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=req.req_to_token, token_to_kv_pool_allocator=allocator, token_to_kv_pool=pool,
            page_size=1, device=str(dev), is_draft_worker=False)
        return runner

    def backend(self, name: str, runner):
        """SGLang's attention backend `name`, built through SGLang's registry."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        return ATTENTION_BACKENDS[name](runner)


class Step:
    """One TARGET_VERIFY (n > 0 draft tokens per request, tree = a random tree per request) or
    DECODE (n = 0) batch: prefix lengths `lens` at slots scattered over the pool (or over its
    first `within` slots), which holds random rows."""

    def __init__(self, harness: Harness, lens: list[int], n: int, gen: torch.Generator, *, chain: bool = False,
                 within: int | None = None):
        from kgen.mask import mask_from_parents, unpack_bits
        from kgen.inputs import tree_parents

        self.h, self.lens, self.n = harness, list(lens), n
        self.verify = n > 0
        bs, per = len(lens), max(n, 1)
        new = [length + n if self.verify else length for length in lens]  # tokens in req_to_token
        num_slots = harness.max_bs * harness.context_len
        slots = torch.randperm(within or num_slots, generator=gen)[:sum(new)] + 1  # slot 0: SGLang's padding slot
        self.rows = [slots[a - b:a] for a, b in zip(torch.tensor(new).cumsum(0).tolist(), new)]
        self.pool = torch.randn(num_slots + 1, 1, R + P, generator=gen).to(torch.bfloat16)
        self.q = torch.randn(bs * per, harness.heads, R + P, generator=gen).to(torch.bfloat16)
        self.k = torch.randn(bs * per, 1, R + P, generator=gen).to(torch.bfloat16)
        # the new tokens' slots: a verify batch's tree tokens follow the prefix; decode: the last token
        self.out_cache_loc = torch.cat([r[-per:] for r in self.rows]).long()
        self.tree = None
        if self.verify:
            parents = tree_parents("chain" if chain else "random", bs, n, generator=gen, device="cpu")
            self.tree = unpack_bits(mask_from_parents(parents, words=(n + 31) // 32), n).view(bs, n, n)

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
        runner.token_to_kv_pool.get_key_buffer(0)[:self.pool.shape[0]].copy_(self.pool)

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

    def reference(self) -> torch.Tensor:
        """[T, H, 512] float64: each new token attends to its prefix (and, verifying, the tree
        tokens its mask shows; decoding, the prefix includes its own row, written from k)."""
        outs, pool = [], self.pool[:, 0].double()
        per = max(self.n, 1)
        for b, length in enumerate(self.lens):
            q, k = self.q[b * per:(b + 1) * per].double(), self.k[b * per:(b + 1) * per, 0].double()
            if self.verify:
                keys = torch.cat([pool[self.rows[b][:length]], k])
                visible = torch.cat([torch.ones(self.n, length, dtype=torch.bool), self.tree[b]], 1)
            else:
                keys = torch.cat([pool[self.rows[b][:length - 1]], k])
                visible = torch.ones(1, length, dtype=torch.bool)
            logits = torch.einsum("nhd,kd->nhk", q, keys) * SCALE
            p = torch.softmax(logits.masked_fill(~visible[:, None, :], float("-inf")), -1)
            outs.append(torch.einsum("nhk,kd->nhd", p, keys[:, :R]))
        return torch.cat(outs)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu().reshape(b.shape), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
