"""SGLang's DSA attention backends (DeepseekSparseAttnBackend, and kgen's KgenDSABackend in front
of it), built outside a server for tests/test_sglang_dsa_sglang.py (CPU) and
tests/test_sglang_dsa_gpu.py (GPU), targeting the installed sglang 0.5.23.

`DSAHarness` publishes a GLM-5-shaped SGLang configuration (`--attention-backend dsa`, page size
64, EAGLE with `topk` branches, the DSA top-k on torch) and builds model runners with exactly what
the DSA backends read of one: a DSATokenToKVPool (bf16 or fp8 scaled rows), a req_to_token pool,
a GLM-5 config (its DSA fields, one layer, `heads` heads per rank) and one absorbed-MLA
RadixAttention layer. `DSAStep` is one TARGET_VERIFY (n > 0 draft tokens per request, a random
tree or a chain) or DECODE (n = 0) batch in SGLang's own terms, over prefixes at whole pages
scattered over the pool, plus the indexer's logits (by a reference of its logits kernel's
contract) and the references the tests compare with.
"""

from __future__ import annotations

import os
import sys
import types

import torch
from sglang_harness import Step, _Absent, _package

def stand_in_deep_gemm() -> list[str]:
    """Where DeepGEMM cannot be imported (the GPU machine lacks it), a deep_gemm whose paged-MQA
    schedule functions keep their contract's shapes: every DSA backend's init_forward_metadata
    sizes the indexer's logits schedule with them ([num_sms + 1, 2] int32, read by DeepGEMM's
    fp8_paged_mqa_logits alone). The tests compute the logits by a reference (DSAStep.logits), so
    the schedule's values are never read; every other deep_gemm name fails when called."""
    try:
        import deep_gemm  # noqa: F401
        return []
    except Exception:
        pass
    # the stand-in is no DeepGEMM: SGLang must not take its JIT GEMM paths, which import
    # deep_gemm.utils; it decides when deep_gemm_wrapper is first imported (before this, it found none)
    configurer = sys.modules.get("sglang.srt.layers.deep_gemm_wrapper.configurer")
    if configurer is None:
        os.environ["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    else:
        assert not configurer.ENABLE_JIT_DEEPGEMM, "SGLang enabled DeepGEMM where none is installed"
    dg = _package("deep_gemm", _Absent)
    dg.get_num_sms = lambda: torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    dg.get_paged_mqa_logits_metadata = lambda lens, block_kv, num_sms: torch.zeros(
        num_sms + 1, 2, dtype=torch.int32, device=lens.device)
    return ["deep_gemm (the paged-MQA schedule's shape only)"]


R, P = 512, 64  # kv_lora_rank, qk_rope_head_dim
SCALE = 0.0625
KV_DTYPES = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


class DSAHarness:
    def __init__(self, device, *, heads: int = 8, index_topk: int = 2048, kv_cache_dtype: str = "bfloat16",
                 topk: int = 4, draft_tokens: int = 16, max_bs: int = 4, context_len: int = 4096,
                 dsa_decode_backend: str = "triton"):
        from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
        from sglang.srt.runtime_context import get_context, get_parallel
        from transformers import PretrainedConfig

        self.device, self.heads, self.max_bs, self.context_len = torch.device(device), heads, max_bs, context_len
        self.index_topk, self.draft_tokens, self.dtype = index_topk, draft_tokens, KV_DTYPES[kv_cache_dtype]
        self._server_args = get_context().override_server_args(
            attention_backend="dsa", page_size=64, chunked_prefill_size=-1, kv_cache_dtype=kv_cache_dtype,
            cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL),
                                              prefill=PhaseConfig(backend=Backend.DISABLED)),
            disable_radix_cache=True, dp_size=1, enable_deterministic_inference=False, pp_size=1, tp_size=1,
            speculative_algorithm="EAGLE", speculative_eagle_topk=topk, speculative_num_draft_tokens=draft_tokens,
            speculative_num_steps=max(1, draft_tokens - 1) if topk == 1 else 3,
            dsa_prefill_backend=dsa_decode_backend, dsa_decode_backend=dsa_decode_backend, dsa_topk_backend="torch")
        self._server_args.install()
        self._parallel = get_parallel().override(attn_tp_size=1, attn_dcp_rank=0)
        self._parallel.__enter__()
        # GLM-5's config fields the DSA path reads (any transformers version: no glm_moe_dsa class needed)
        self.hf = PretrainedConfig(architectures=["GlmMoeDsaForCausalLM"], num_hidden_layers=1, indexer_types=["full"],
                                   num_attention_heads=heads, index_topk=index_topk, index_head_dim=128,
                                   index_n_heads=32, kv_lora_rank=R, qk_rope_head_dim=P, qk_nope_head_dim=192)

    def runner(self) -> types.SimpleNamespace:
        from sglang.srt.configs.model_config import AttentionArch
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim
        from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool

        h, dev = self.heads, str(self.device)
        config = types.SimpleNamespace(
            attention_arch=AttentionArch.MLA, context_len=self.context_len, num_attention_heads=h, kv_lora_rank=R,
            qk_nope_head_dim=192, qk_rope_head_dim=P, head_dim=R + P, v_head_dim=R, index_head_dim=128,
            hf_config=self.hf, hf_text_config=self.hf, is_encoder_decoder=False, get_num_kv_heads=lambda tp, dcp=1: 1)
        pool = DSATokenToKVPool(size=self.max_bs * self.context_len, page_size=64, kv_lora_rank=R, dtype=self.dtype,
                                qk_rope_head_dim=P, layer_num=1, device=dev, index_head_dim=128,
                                enable_memory_saver=False,
                                kv_cache_dim=calculate_mla_kv_cache_dim(model_config=config, kv_cache_dtype=self.dtype))
        req = ReqToTokenPool(size=self.max_bs, max_context_len=self.context_len, device=dev, enable_memory_saver=False)
        layer = RadixAttention(num_heads=h, head_dim=R + P, scaling=SCALE, num_kv_heads=1, layer_id=0, v_head_dim=R)
        return types.SimpleNamespace(
            device=dev, gpu_id=self.device.index or 0, page_size=64, model_config=config, req_to_token_pool=req,
            token_to_kv_pool=pool, hisparse_coordinator=None, is_draft_worker=False, kv_cache_dtype=self.dtype,
            max_running_requests=self.max_bs, sliding_window_size=None, model=torch.nn.ModuleList([layer]),
            layer=layer, kv_index_translator=None)  # None: Step.forward_batch binds no KV-loc plan

    def backend(self, runner, name: str = "dsa"):
        """The backend SGLang's attention registry builds for `name` (kgen's with KGEN_DSA=1)."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        return ATTENTION_BACKENDS[name](runner)


class DSAStep(Step):
    """One batch: prefix lengths `lens`; a verify batch (n tree tokens per request, each request's
    tree tokens right after its prefix) or a decode batch (n = 0: the new token is the last of
    `lens`). Slots fill whole pages, the pages a random permutation of the pool's (page 0 is
    SGLang's padding page); the pool holds random rows. The ForwardBatch (and its verify input) is
    built as sglang_harness.Step builds it."""

    def __init__(self, harness: DSAHarness, lens: list[int], n: int, gen: torch.Generator, *, chain: bool = False):
        from kgen.mask import mask_from_parents, unpack_bits
        from kgen.inputs import tree_parents

        self.h, self.lens, self.n, self.verify = harness, list(lens), n, n > 0
        per = max(n, 1)
        total = [length + n for length in lens]
        pages_each = [(t + 63) // 64 for t in total]
        pages = torch.randperm(harness.max_bs * harness.context_len // 64 - 1, generator=gen)[:sum(pages_each)] + 1
        ends = torch.tensor(pages_each).cumsum(0).tolist()
        self.rows = [(pages[e - c:e, None] * 64 + torch.arange(64)).flatten()[:t]
                     for e, c, t in zip(ends, pages_each, total)]
        self.rows_bf16 = torch.randn(harness.max_bs * harness.context_len + 64, R + P, generator=gen)
        self.q = torch.randn(len(lens) * per, harness.heads, R + P, generator=gen).to(torch.bfloat16)
        self.k = torch.randn(len(lens) * per, 1, R + P, generator=gen).to(torch.bfloat16)
        self.out_cache_loc = torch.cat([r[-per:] for r in self.rows]).long()
        parents = tree_parents("chain" if chain else "random", len(lens), per, generator=gen, device="cpu")
        self.visible = unpack_bits(mask_from_parents(parents, words=(per + 31) // 32), per)  # [R, per]
        self.tree = self.visible.view(len(lens), per, per)  # what Step.custom_mask reads
        self.logits_seed = int(torch.randint(1 << 30, (1,), generator=gen))

    def load(self, runner) -> None:
        """Write the req_to_token rows (request b in row b + 1) and the prefix rows: bf16 as they
        are, fp8 through SGLang's own writer for the pool."""
        req = runner.req_to_token_pool.req_to_token
        req.zero_()
        for b, row in enumerate(self.rows):
            req[b + 1, :row.numel()] = row.to(runner.device, torch.int32)
        slots = torch.cat([r[:length - (0 if self.verify else 1)] for r, length in zip(self.rows, self.lens)])
        kv = self.rows_bf16[slots].to(torch.bfloat16).to(runner.device).unsqueeze(1)
        runner.token_to_kv_pool.set_mla_kv_buffer(runner.layer, slots.to(runner.device), kv[..., :R].contiguous(),
                                                  kv[..., R:].contiguous())

    def logits(self, width: int, device) -> torch.Tensor:
        """The indexer's logits [rows, width] (column = position t in the request), by a reference
        of the contract of its fp8 paged-MQA logits kernel (DeepGEMM's, which the test machines
        lack): logits[i, t] = sum_h w[i, h] · relu(<q[i, h], k[t]>), over random index queries
        (32 heads of 128), head weights and index keys of the request's tokens."""
        gen = torch.Generator().manual_seed(self.logits_seed)
        rows = self.q.shape[0]
        q = torch.randn(rows, 32, 128, generator=gen)
        w = torch.rand(rows, 32, generator=gen)
        keys = torch.randn(width, 128, generator=gen)  # column t: the request's token at position t
        return torch.einsum("ih,iht->it", w, torch.relu(torch.einsum("ihd,td->iht", q, keys))).to(device)

    def inputs(self, device):
        """(q_nope [T, H, 512], k_nope [T, 1, 512], q_rope [T, H, 64], k_rope [T, 1, 64]) as
        DeepSeek's absorbed core passes them to a DSA backend."""
        q, k = self.q.to(device), self.k.to(device)
        return q[..., :R].contiguous(), k[..., :R].contiguous(), q[..., R:].contiguous(), k[..., R:].contiguous()

    def reference_selection(self, logits: torch.Tensor, topk: int, tree_aware: bool) -> list[set[int]]:
        """Each row's selected positions: the top-k logits over positions 0 .. L + i (a chain's
        ancestors: SGLang's verify rows) — tree_aware: only the prefix and i's ancestors (or i)."""
        sel, per = [], max(self.n, 1)
        for r in range(logits.shape[0]):
            b, i = divmod(r, per)
            length = self.lens[b] + (i + 1 if self.verify else 0)
            valid = torch.zeros(logits.shape[1], dtype=torch.bool)
            valid[:length] = True
            if tree_aware and self.verify:
                valid[self.lens[b]:self.lens[b] + per] &= self.visible[r]
            scores = logits[r].cpu().masked_fill(~valid, float("-inf"))
            top = torch.topk(scores, min(topk, int(valid.sum()))).indices
            sel.append(set(top.tolist()))
        return sel

    def reference(self, pool_rows: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
        """[T, H, 512] float64: row i attends to the physical slots in lists[i] (the pool's rows
        after the step stored its new tokens), except its request's tree tokens its tree hides."""
        from kgen.reference import attend

        outs, per = [], max(self.n, 1)
        for r, row in enumerate(lists.cpu().tolist()):
            b, i = divmod(r, per)
            own = self.out_cache_loc[b * per:(b + 1) * per].tolist()
            keep = [s for s in row if s >= 0 and (s not in own or self.visible[r, own.index(s)])]
            keys = pool_rows[torch.tensor(keep, dtype=torch.long)]
            o, _ = attend(self.q[r:r + 1].double(), keys, torch.ones(1, len(keep), dtype=torch.bool), SCALE, R)
            outs.append(o)
        return torch.cat(outs)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu().reshape(b.shape), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
