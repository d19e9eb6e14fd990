"""Run by tests/test_sglang_glm5.py in a fresh interpreter: SGLang's real server-arg resolution
(`ServerArgs.resolve_once`, every step of its pipeline) for a GLM-5-shaped model — a local
config directory argv[1] written here from transformers' own `glm_moe_dsa` config (four layers,
8 heads; nothing downloaded) — launched with `--attention-backend kgen` and an EAGLE tree
(topk 4). The GPU's compute capability, which SGLang's DSA defaults read, is given per case.
Prints one JSON line: per case, the resolved fields or the error.

First without kgen's resolution hook (only the backend registered, so `kgen` is a valid choice:
SGLang's own check refuses the tree at page size 64), then with kgen's plugin as SGLang loads it;
last, docs/sglang.md's GLM-5 launch commands (argv[2], JSON: [sm_90 arguments, sm_120 arguments])
with the local config as the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_harness import stand_in_missing  # noqa: E402

stand_in_missing()

import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402

TREE = ["--attention-backend", "kgen", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16", "--device", "cuda"]


def write_config(path: str) -> None:
    AutoConfig.for_model(
        "glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"], num_hidden_layers=4, num_attention_heads=8,
        hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256, n_routed_experts=8, num_experts_per_tok=2,
        first_k_dense_replace=1, num_nextn_predict_layers=1, vocab_size=1024, index_n_heads=4, q_lora_rank=256,
        max_position_embeddings=4096).save_pretrained(path)


def resolve(model: str, capability: tuple[int, int], *extra: str, argv: list[str] | None = None) -> dict:
    """Resolve `--model-path model` with TREE and `extra` (or with `argv`, its model path replaced)."""
    from sglang.srt.arg_groups.overrides import attention_backends_of, resolved_view
    from sglang.srt.server_args import ServerArgs

    torch.cuda.get_device_capability = lambda *a, **k: capability
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    if argv is None:
        argv = ["--model-path", model, *TREE, *extra]
    else:  # a documented command; --device: this machine has no GPU for SGLang to find
        argv = [model if i and argv[i - 1] == "--model-path" else a for i, a in enumerate(argv)] + ["--device", "cuda"]
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    try:
        args.resolve_once()
    except ValueError as e:
        return dict(error=str(e))
    v = resolved_view(args)
    return dict(attention_backend=v.attention_backend, verify_and_decode=list(attention_backends_of(v)),
                speculative_attention_mode=v.speculative_attention_mode, page_size=v.page_size,
                kv_cache_dtype=v.kv_cache_dtype, draft_backend=v.speculative_draft_attention_backend,
                topk=v.speculative_eagle_topk, draft_tokens=v.speculative_num_draft_tokens,
                draft_kv_cache_dtype=v.speculative_draft_kv_cache_dtype, radix_cache=not v.disable_radix_cache,
                chunked_prefill_size=v.chunked_prefill_size, prefill_graph=str(v.cuda_graph_config.prefill.backend))


def main(model: str, docs: list[list[str]]) -> dict:
    write_config(model)
    from kgen.integrations import sglang as integration
    from kgen.integrations import sglang_compat as compat

    compat.register_backend(integration.NAME, integration.create_backend)
    report = dict(unhooked=resolve(model, (9, 0)))
    from sglang.srt.plugins import load_plugins

    load_plugins()  # kgen's entry point: register(), the resolution hook included
    report.update(sm120=resolve(model, (12, 0)), sm90=resolve(model, (9, 0)),
                  sm90_flashinfer_draft=resolve(model, (9, 0), "--speculative-draft-attention-backend", "flashinfer"),
                  sm90_page1=resolve(model, (9, 0), "--page-size", "1"),
                  sm90_triton=resolve(model, (9, 0), "--attention-backend", "triton"),
                  docs_sm90=resolve(model, (9, 0), argv=docs[0]), docs_sm120=resolve(model, (12, 0), argv=docs[1]))
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
