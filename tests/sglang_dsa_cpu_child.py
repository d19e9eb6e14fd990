"""Run by tests/test_sglang_dsa_sglang.py in a fresh interpreter (KGEN_DSA=1, TRITON_INTERPRET=1,
SGLANG_DSA_FUSE_TOPK=0): the installed SGLang loads kgen's plugin, and either

- `resolve CAP`: resolves the server args of a GLM-5-shaped local config with EAGLE trees
  (`--attention-backend dsa --speculative-eagle-topk 4`), as on a GPU of compute capability CAP,
  with and without kgen's plugin; or
- `backend SEED`: builds kgen's DSA backend through SGLang's registry on a GLM-5-shaped runner
  (tests/sglang_dsa_harness.py) and runs tree and chain TARGET_VERIFY and DECODE batches.

and prints one JSON report line. Stood in on this CPU machine, each named in the report: the GPU's
compute capability (SGLang's DSA backend and resolution read it); SGLang's Triton kernels that
assert a CUDA tensor (seqlens_expand_triton, the pool's row writer), by torch code of their
contracts; kgen's compiled sparse kernel, by the §12 reference (kgen.reference, through tests/sparse_reference.py); and
SGLang's own DSA attention kernels (only to record that a call went to them).
"""

from __future__ import annotations

import json
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_harness import stand_in_missing  # noqa: E402

STOOD_IN = stand_in_missing()

import torch  # noqa: E402


def as_gpu(capability: tuple[int, int]) -> None:
    """Answer SGLang's and kgen's questions about the GPU as a device of `capability` would."""
    torch.cuda.get_device_capability = lambda *a, **k: capability
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=capability[0],
                                                                               minor=capability[1])
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 8
    torch.cuda.get_device_name = lambda *a, **k: f"a GPU of compute capability {capability}"
    STOOD_IN.append(f"compute capability {capability[0]}.{capability[1]}")


# ---- resolve: the server args -------------------------------------------------------------------


def resolve(capability: str) -> dict:
    as_gpu(tuple(int(c) for c in capability.split(".")))
    from transformers import GlmMoeDsaConfig

    model = tempfile.mkdtemp()
    GlmMoeDsaConfig(num_hidden_layers=2, indexer_types=["full", "full"], architectures=["GlmMoeDsaForCausalLM"],
                    num_nextn_predict_layers=1).save_pretrained(model)
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.server_args import ServerArgs

    def run(**flags):
        args = ServerArgs(model_path=model, attention_backend="dsa", speculative_algorithm="EAGLE",
                          speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=16,
                          device="cuda", tp_size=8, skip_tokenizer_init=True, **flags)
        try:
            args.resolve_once()
        except ValueError as e:
            return dict(error=str(e))
        view = resolved_view(args)
        return dict(attention_backend=view.attention_backend, page_size=view.page_size,
                    kv_cache_dtype=view.kv_cache_dtype, topk=view.speculative_eagle_topk,
                    draft_backend=view.speculative_draft_attention_backend)

    draft = dict(speculative_draft_attention_backend="triton")
    if capability.startswith("12"):  # docs/sglang.md: the draft's own pool in bf16 rows on sm_120
        draft["speculative_draft_kv_cache_dtype"] = "bf16"
    without = run(**draft)
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins import load_plugins

    sglangs = ATTENTION_BACKENDS["dsa"]
    load_plugins()
    import kgen.integrations.sglang_dsa as ks

    entry = ATTENTION_BACKENDS["dsa"]
    return dict(stood_in=STOOD_IN, without_kgen=without, with_kgen=run(**draft),
                with_kgen_dsa_draft=run(),
                registry=dict(kgens=getattr(entry, "func", None) is ks.create_backend,
                              own_is_sglangs=getattr(entry, "keywords", {}).get("own") is sglangs,
                              kgen_too="kgen" in ATTENTION_BACKENDS))


# ---- backend: the real class on a GLM-5-shaped runner --------------------------------------------


def stand_in_cuda_only_kernels() -> None:
    """Torch code for the contracts of the Triton kernels SGLang's DSA path runs that assert a CUDA
    tensor (on the GPU machine the real ones run)."""
    import sglang.srt.layers.attention.dsa_backend as dsa
    import sglang.srt.mem_cache.memory_pool as pools

    def seqlens_expand(extend_seq_lens, seq_lens, total_len, max_q_len):
        # each request's qo rows see kv_len - qo_len + 1 ... kv_len keys (at least 0)
        return torch.cat([torch.arange(int(s) - int(e) + 1, int(s) + 1).clamp(min=0)
                          for e, s in zip(extend_seq_lens.tolist(), seq_lens.tolist())]).to(torch.int32)

    def write_rows(dst, loc, nope, rope):
        # row loc[i] of dst = nope[i] | rope[i] (bytes of the pool's storage dtype)
        dst.view(dst.shape[0], -1)[loc.long()] = torch.cat([nope.reshape(loc.numel(), -1),
                                                             rope.reshape(loc.numel(), -1)], -1)

    dsa.seqlens_expand_triton = seqlens_expand
    pools.MLATokenToKVPool._scatter_mla_rows = lambda self, dst, loc, nope, rope: write_rows(dst, loc, nope, rope)
    STOOD_IN.extend(["seqlens_expand_triton", "MLATokenToKVPool._scatter_mla_rows"])


def backend(seed: int) -> dict:
    as_gpu((9, 0))
    stand_in_cuda_only_kernels()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_dsa_harness import DSAHarness, DSAStep, rel_l2
    from sparse_reference import ReferenceModule, dequantize_rows

    import kgen.integrations.sglang_dsa as ks
    from kgen.integrations.sglang_sparse import physical_lists

    specs = []

    def reference_module(data):
        specs.append(data)
        m = data["model"]
        return ReferenceModule(heads=m["num_q_heads"], index_topk=m["index_topk"],
                               max_nodes=data["tree"]["max_nodes"], scale=m["softmax_scale"],
                               kv_dtype=data["cache"]["kv_dtype"], page_size=data["cache"]["page_size"])

    ks.sparse_module = reference_module
    STOOD_IN.append("kgen's sparse kernel (the §12 reference)")
    gen = torch.Generator().manual_seed(seed)
    k_top = 24
    harness = DSAHarness("cpu", heads=8, index_topk=k_top, topk=4, draft_tokens=8, max_bs=4, context_len=1024)
    runner = harness.runner()
    kb = harness.backend(runner)
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    sglangs = ATTENTION_BACKENDS["dsa"].keywords["own"](runner)  # SGLang's own factory: its DSA backend
    report = dict(stood_in=STOOD_IN, cls=type(kb).__name__, base=type(sglangs).__name__, kgen_on=kb.kgen is not None,
                  off_reason=kb.kgen_off_reason, spec=specs[0], selection={}, errors={}, stored={}, kgen_calls={})
    layer = runner.layer

    def run(name, step, capture=None):
        """One batch, its metadata eager or (capture True/False) through the CUDA-graph hooks."""
        step.load(runner)
        fb = step.forward_batch(runner)
        if capture is None:
            kb.init_forward_metadata(fb)
        else:
            kb.init_forward_metadata_out_graph(fb, in_capture=capture)
        sglangs.init_forward_metadata(fb)
        width = kb.forward_metadata.page_table_1.shape[1]
        logits = step.logits(width, "cpu")
        ours = kb.get_indexer_metadata(0, fb).topk_transform(logits.clone(), k_top)
        theirs = sglangs.get_indexer_metadata(0, fb).topk_transform(logits.clone(), k_top)
        sets = lambda lists: [set(r) - {-1} for r in lists.tolist()]  # noqa: E731
        report["selection"][name] = dict(
            tree_aware=sets(ours) == step.reference_selection(logits, k_top, tree_aware=True),
            sglangs_is_the_chain_rule=sets(theirs) == step.reference_selection(logits, k_top, tree_aware=False),
            equals_sglangs=torch.equal(ours, theirs), kind=type(kb.get_indexer_metadata(0, fb)).__name__)
        q_nope, k_nope, q_rope, k_rope = step.inputs("cpu")
        calls = len(kb.kgen.module.calls)
        forward = kb.forward_extend if step.verify else kb.forward_decode
        out = forward(q_nope, k_nope, k_nope, layer, fb, True, q_rope=q_rope, k_rope=k_rope, topk_indices=ours)
        report["kgen_calls"][name] = len(kb.kgen.module.calls) - calls
        rows = dequantize_rows(runner.token_to_kv_pool.get_key_buffer(0))
        lists = physical_lists(ours, kb.forward_metadata.page_table_1)
        report["errors"][name] = rel_l2(out, step.reference(rows, lists))
        report["stored"][name] = torch.equal(rows[fb.out_cache_loc.long()],
                                             torch.cat([k_nope, k_rope], -1)[:, 0].double())
        return fb, (q_nope, k_nope, q_rope, k_rope, ours)

    run("tree", DSAStep(harness, [70, 130, 5], 8, gen))
    run("chain", DSAStep(harness, [90, 200], 8, gen, chain=True))
    fb, (q_nope, k_nope, q_rope, k_rope, lists) = run("decode", DSAStep(harness, [77, 150, 3], 0, gen))

    # the CUDA-graph hooks: buffers allocated once, metadata rewritten in place for each replay
    kb.init_cuda_graph_state(harness.max_bs, harness.max_bs * harness.draft_tokens)
    stable = []
    for i, lens in enumerate(([60, 100, 7], [120, 33, 64], [5, 190, 80])):
        run(f"graph{i}", DSAStep(harness, lens, 8, gen), capture=i == 0)
        stable.append(all(getattr(kb._kgen_tree, k).data_ptr() == v.data_ptr() for k, v in kb.kgen.graph.items()))
    report["graph_buffers"] = stable

    # calls kgen does not serve go to SGLang's DSA backend (its kernels stood in by a recorder)
    routed = []
    base = type(sglangs)
    base.forward_decode = lambda self, *a, **kw: routed.append("dsa") or torch.zeros(1)
    base.forward_extend = base.forward_decode
    STOOD_IN.append("SGLang's DSA attention kernels (recorded, not run)")
    kb.forward_decode(q_nope, k_nope, k_nope, layer, fb, True, q_rope=q_rope, k_rope=k_rope, topk_indices=lists,
                      attn_sink=torch.zeros(8))
    kb.forward_decode(q_nope, k_nope, k_nope, layer, fb, True, q_rope=q_rope, k_rope=k_rope, topk_indices=None)
    kb.forward_decode(q_nope, k_nope, k_nope, layer, fb, True, topk_indices=lists)
    kb.forward_extend(q_nope, k_nope, k_nope, layer, fb, True, q_rope=q_rope, k_rope=k_rope, topk_indices=lists)
    report["routed"] = routed

    # kgen off (a module without the sparse op) with EAGLE trees: one line at construction
    ks.sparse_module = lambda data: types.SimpleNamespace(spec=types.SimpleNamespace(name="dense_only"))
    try:
        harness.backend(runner)
        report["off_with_trees"] = None
    except Exception as e:  # noqa: BLE001 - reported for the test to check
        report["off_with_trees"] = f"{type(e).__name__}: {e}"
    return report


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    result = resolve(arg) if mode == "resolve" else backend(int(arg))
    print(json.dumps(result))
