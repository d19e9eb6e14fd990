"""kgen's DSA backend (KgenDSABackend, KGEN_DSA=1) on a GPU, built through SGLang's attention
registry on GLM-5-shaped runners (tests/sglang_dsa_harness.py: one DSA layer, 8 heads per rank,
DSATokenToKVPool with page size 64), with kgen's compiled sparse verify kernel:

- chain (topk = 1), bf16 pool: kgen's sparse verify through this backend against SGLang's own
  DeepseekSparseAttnBackend's TARGET_VERIFY on the same inputs and the same selected lists (its
  pure-Triton sparse MLA, `--dsa-decode-backend triton`), relative L2 <= 1e-2; the lists kgen's
  indexer hook selects equal SGLang's own; DECODE likewise;
- tree (topk = 4), fp8 scaled rows (656 bytes, written by SGLang's own writer; skipped while kgen's
  sparse specs lack cache.scales per_block) and bf16 rows: every tree token
  against the float64 attention over the lists the tree-aware indexer selected (the selection
  itself checked against the rule: prefix plus the token's own ancestors), eager and replayed
  from a captured CUDA graph (the indexer's top-k and the attention in the graph, SGLang's
  graph-metadata hook before capture and before every replay).

Stood in (printed): sgl_kernel (SGLang's compiled CUDA kernels; the GPU machine lacks it), DeepGEMM's
paged-MQA schedule (its shape: every DSA backend's metadata sizes it) and the indexer's fp8
paged-MQA logits kernel (DeepGEMM's): the logits come from a reference of its contract
(DSAStep.logits) and go through SGLang's own top-k (the torch one, SGLANG_DSA_FUSE_TOPK=0, whose
fused kernels are sgl_kernel's). Run with bench/gpu_sglang.sh (which sets the environment).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from kgen.timing import capture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_dsa_harness import DSAHarness, DSAStep, rel_l2, stand_in_deep_gemm  # noqa: E402
from sglang_harness import stand_in_missing  # noqa: E402
from sparse_reference import dequantize_rows  # noqa: E402

pytestmark = pytest.mark.gpu

MAX_BS, CONTEXT, TOL = 4, 8192, 1e-2


def _setup(cuda, **kw) -> DSAHarness:
    _skip_without_sparse_specs(**(dict(kv_dtype="float8_e4m3fn", scales="per_block")
                                  if kw["kv_cache_dtype"] == "fp8_e4m3" else {}))
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (bench/gpu_sglang.sh installs the carried wheels)")
    if os.environ.get("SGLANG_DSA_FUSE_TOPK") != "0":
        pytest.skip("needs SGLANG_DSA_FUSE_TOPK=0 (SGLang's fused top-k is sgl_kernel's): bench/gpu_sglang.sh sets it")
    stood_in = stand_in_missing() + stand_in_deep_gemm()
    print(f"stood in for: {stood_in + ['the indexer fp8 paged-MQA logits kernel (a reference of its contract)']}")
    os.environ["KGEN_DSA"] = "1"
    from kgen.integrations import sglang as integration

    integration.register()
    return DSAHarness(cuda, max_bs=MAX_BS, context_len=CONTEXT, **kw)


def _skip_without_sparse_specs(**cache) -> None:
    """Skip unless this kgen builds sparse specs (model.index_topk) with these cache fields."""
    import yaml

    from kgen.errors import SpecError
    from kgen.spec import parse_spec

    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "specs" / "glm5_sm120.yaml").read_text())
    data["model"]["index_topk"] = 2048
    data["cache"].update(cache)
    try:
        parse_spec(data)
    except SpecError as e:
        pytest.skip(f"this kgen has no sparse specs with cache {cache or 'bf16'} yet (DESIGN §11-§12): {e}")


@pytest.fixture(scope="module")
def chain_setup(cuda):
    harness = _setup(cuda, topk=1, draft_tokens=4, kv_cache_dtype="bfloat16")
    runner = harness.runner()
    kb = harness.backend(runner)
    assert kb.kgen is not None, kb.kgen_off_reason
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    return harness, runner, kb, ATTENTION_BACKENDS["dsa"].keywords["own"](runner)


def _select(backend, fb, logits):
    return backend.get_indexer_metadata(0, fb).topk_transform(logits.clone(), backend.dsa_index_topk)


def _forward(backend, runner, fb, step, lists):
    q_nope, k_nope, q_rope, k_rope = step.inputs(runner.device)
    forward = backend.forward_extend if step.verify else backend.forward_decode
    return forward(q_nope, k_nope, k_nope, runner.layer, fb, True, q_rope=q_rope, k_rope=k_rope, topk_indices=lists)


@pytest.mark.parametrize("verify", [True, False], ids=["target_verify_chain", "decode"])
def test_kgen_matches_sglangs_dsa_backend_on_a_chain(chain_setup, seed, verify):
    harness, runner, kb, sglangs = chain_setup
    gen = torch.Generator().manual_seed(seed)
    for i, lens in enumerate(([100, 3000, 5000, 64], [2047, 2048, 2049, 7000], [9, 8000], [4100])):
        step = DSAStep(harness, lens, 4 if verify else 0, gen, chain=True)
        step.load(runner)
        fb = step.forward_batch(runner)
        sglangs.init_forward_metadata(fb)
        kb.init_forward_metadata(fb)
        logits = step.logits(kb.forward_metadata.page_table_1.shape[1], runner.device)
        theirs, ours = _select(sglangs, fb, logits), _select(kb, fb, logits)
        assert torch.equal(ours, theirs), f"batch {i}: kgen's selection differs from SGLang's on a chain"
        want = _forward(sglangs, runner, fb, step, theirs)
        got = _forward(kb, runner, fb, step, ours)
        assert kb.kgen_mode == ("verify" if verify else "decode")
        err = rel_l2(got, want.view(got.shape))
        assert err <= TOL, f"batch {i} (lens {lens}): kgen vs SGLang's DSA verify, rel L2 {err:.3g}"


@pytest.fixture(scope="module", params=["fp8_e4m3", "bfloat16"])
def tree_setup(cuda, request):
    harness = _setup(cuda, topk=4, draft_tokens=16, kv_cache_dtype=request.param)
    runner = harness.runner()
    kb = harness.backend(runner)
    assert kb.kgen is not None, kb.kgen_off_reason
    assert not kb.use_fused_topk
    width = runner.token_to_kv_pool.get_key_buffer(0).shape[-1]
    assert width == (656 if request.param == "fp8_e4m3" else 576), f"SGLang's pool rows are {width} wide"
    return harness, runner, kb


def _check_tree(step, runner, kb, logits, lists, out, what):
    """The lists are the tree-aware selection (logical positions: SGLANG_DSA_FUSE_TOPK=0) and
    out is attention over them, against the float64 reference on the dequantized pool."""
    from kgen.integrations.sglang_sparse import physical_lists

    selected, logits = [set(r) - {-1} for r in lists.cpu().tolist()], logits.cpu()
    want = step.reference_selection(logits, kb.dsa_index_topk, tree_aware=True)
    wrong = [r for r, (got, exp) in enumerate(zip(selected, want)) if not _same_top_k(logits[r], got, exp)]
    assert not wrong, f"{what}: the selection is not the prefix plus each token's own ancestors: " + \
        _selection_diff(logits, wrong[0], selected[wrong[0]], want[wrong[0]])
    rows = dequantize_rows(runner.token_to_kv_pool.get_key_buffer(0)).cpu()
    want = step.reference(rows, physical_lists(lists, kb.forward_metadata.page_table_1))
    assert not torch.isnan(out).any(), f"{what}: NaN in kgen's output"
    err = rel_l2(out, want)
    assert err <= TOL, f"{what} (lens {step.lens}): kgen vs the float64 reference, rel L2 {err:.3g}"


def _same_top_k(logits: torch.Tensor, got: set[int], want: set[int]) -> bool:
    """Two top-k selections of one row agree up to ties at the boundary: every position in one and
    not the other holds exactly the k-th logit (which of equal logits a top-k keeps is its own
    choice: torch.topk on the GPU and on the CPU differ there; seen at a float32 tie, call BG)."""
    if got == want:
        return True
    kth = min(float(logits[t]) for t in want)
    return len(got) == len(want) and all(float(logits[t]) == kth for t in got ^ want)


def _selection_diff(logits: torch.Tensor, row: int, got: set[int], want: set[int]) -> str:
    """Row `row`'s positions selected but not wanted and wanted but not selected, with their logits
    and the lowest logit the reference selected (a near-tie shows as values within an ulp of it)."""
    def logit(t): return f"{t}: {float(logits[row, t]):.9g}"
    lowest = min(float(logits[row, t]) for t in want)
    return (f"row {row}: extra {[logit(t) for t in sorted(got - want)][:8]}, missing "
            f"{[logit(t) for t in sorted(want - got)][:8]}, lowest wanted {lowest:.9g}")


def _check_rows_written_by_sglang(step, runner):
    """SGLang's own writer's 656-byte rows read back per DESIGN §11 are the rows it was given."""
    slots = torch.cat([r[:length] for r, length in zip(step.rows, step.lens)])
    got = dequantize_rows(runner.token_to_kv_pool.get_key_buffer(0)[slots.to(runner.device)]).cpu()
    err = rel_l2(got, step.rows_bf16[slots].to(torch.bfloat16).double())
    assert err <= 0.08, f"SGLang's fp8 rows do not read back as DESIGN §11 says (rel L2 {err:.3g})"


def test_tree_verify_matches_the_reference_eager(tree_setup, seed):
    harness, runner, kb = tree_setup
    gen = torch.Generator().manual_seed(seed)
    for i, lens in enumerate(([100, 3000, 5000, 64], [2040, 2048, 6000], [1], [7900, 300])):
        step = DSAStep(harness, lens, 16, gen)
        step.load(runner)
        if harness.dtype == torch.float8_e4m3fn:
            _check_rows_written_by_sglang(step, runner)
        fb = step.forward_batch(runner)
        kb.init_forward_metadata(fb)
        logits = step.logits(kb.forward_metadata.page_table_1.shape[1], runner.device)
        lists = _select(kb, fb, logits)
        _check_tree(step, runner, kb, logits, lists, _forward(kb, runner, fb, step, lists), f"batch {i}")


def test_tree_verify_replayed_from_a_cuda_graph_matches_the_reference(tree_setup, seed):
    """SGLang's protocol: init_cuda_graph_state once; out_graph(in_capture=True), capture the
    layer (the indexer's top-k and the attention); per step, new values into the captured batch's
    tensors, out_graph, replay."""
    harness, runner, kb = tree_setup
    gen = torch.Generator().manual_seed(seed)
    n = 16
    kb.init_cuda_graph_state(MAX_BS, MAX_BS * n)
    first = DSAStep(harness, [50] * MAX_BS, n, gen)
    first.load(runner)
    fb = first.forward_batch(runner)
    kb.init_forward_metadata_out_graph(fb, in_capture=True)
    width = kb.forward_metadata.page_table_1.shape[1]
    logits = first.logits(width, runner.device)
    q_nope, k_nope, q_rope, k_rope = first.inputs(runner.device)

    captured = {}  # the captured call's lists and output: the tensors each replay rewrites

    def layer():
        captured["lists"] = kb.get_indexer_metadata(0, fb).topk_transform(logits.clone(), kb.dsa_index_topk)
        captured["out"] = kb.forward_extend(q_nope, k_nope, k_nope, runner.layer, fb, True, q_rope=q_rope,
                                            k_rope=k_rope, topk_indices=captured["lists"])

    graph = capture(layer)
    lists, out = captured["lists"], captured["out"]

    for r, lens in enumerate(([100, 3000, 5000, 64], [2040, 2048, 6000, 9], [7900, 300, 1, 4000])):
        step = DSAStep(harness, lens, n, gen)
        step.load(runner)
        new = step.forward_batch(runner)
        for name in ("req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc", "positions"):
            getattr(fb, name).copy_(getattr(new, name))
        fb.seq_lens_sum, fb.spec_info = new.seq_lens_sum, new.spec_info
        kb.init_forward_metadata_out_graph(fb)
        new_logits = step.logits(width, runner.device)
        logits.copy_(new_logits)
        for buf, value in zip((q_nope, k_nope, q_rope, k_rope), step.inputs(runner.device)):
            buf.copy_(value)
        out.fill_(float("nan"))
        graph.replay()
        _check_tree(step, runner, kb, new_logits, lists.clone(), out.clone(), f"replay {r}")
