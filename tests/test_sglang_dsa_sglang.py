"""kgen's DSA backend against the installed SGLang, on the CPU (tests/sglang_dsa_cpu_child.py runs
each part in a fresh interpreter with KGEN_DSA=1; see there what is stood in, and why):

- the server-arg resolution of a GLM-5-shaped local config with EAGLE trees and
  `--attention-backend dsa`, as on sm_90 and sm_120: SGLang alone refuses topk 4 at page size 64;
  with kgen's plugin it resolves (attention backend still "dsa", page 64, the KV dtype each GPU
  gets), with the Triton tree draft; a draft that cannot branch is one line naming the flag; the registry's "dsa"
  entry is kgen's, SGLang's own kept for draft workers;
- the real KgenDSABackend class, built through SGLang's registry on a GLM-5-shaped runner (one
  DSA layer, 8 heads, DSATokenToKVPool page 64, bf16 rows): the indexer hook's top-k is
  tree-aware on a tree (each token scores the prefix and its own ancestors), equals SGLang's own
  selection on a chain and in decode; TARGET_VERIFY (tree, chain; eager and through the CUDA-graph
  metadata hooks, capture then replays in the same buffers) and DECODE run kgen's sparse
  verify (its §12 reference standing in for the kernel) and match attention computed from the
  selected lists, store the new rows; calls kgen does not serve go to SGLang's DSA backend; with
  kgen off, EAGLE trees are refused at construction in one line.
The same class with kgen's kernel against SGLang's DSA verify: tests/test_sglang_dsa_gpu.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SESSION_SEED

CHILD = Path(__file__).resolve().parent / "sglang_dsa_cpu_child.py"


def _child(*args: str) -> dict:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (CI installs it: .ci/run)")
    env = {**os.environ, "KGEN_DSA": "1", "TRITON_INTERPRET": "1", "SGLANG_DSA_FUSE_TOPK": "0",
           "PYTHONPATH": os.pathsep.join([str(CHILD.parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"the sglang child failed:\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"stood in: {', '.join(report['stood_in'])}")
    return report


@pytest.fixture(scope="module", params=["9.0", "12.0"])
def resolution(request):
    return request.param, _child("resolve", request.param)


@pytest.fixture(scope="module")
def report():
    return _child("backend", str(SESSION_SEED))


def test_sglang_alone_refuses_glm5_trees_at_page_size_64(resolution):
    _, r = resolution
    assert "speculative_eagle_topk > 1 with page_size > 1" in r["without_kgen"]["error"]


def test_with_kgen_glm5_trees_resolve_on_the_dsa_backend(resolution):
    cap, r = resolution
    assert r["with_kgen"] == dict(attention_backend="dsa", page_size=64, topk=4, draft_backend="triton",
                                  kv_cache_dtype="bfloat16" if cap == "9.0" else "fp8_e4m3")


def test_a_draft_that_cannot_branch_is_one_line_naming_the_flag(resolution):
    _, r = resolution
    msg = r["with_kgen_dsa_draft"]["error"]
    assert "\n" not in msg and "need --speculative-draft-attention-backend flashinfer, fa3 or triton" in msg
    assert msg.endswith("got None")


def test_the_registrys_dsa_entry_is_kgens_and_keeps_sglangs_for_drafts(resolution):
    _, r = resolution
    assert r["registry"] == dict(kgens=True, own_is_sglangs=True, kgen_too=True)


def test_the_registry_builds_kgens_dsa_backend_with_kgen_on(report):
    assert report["cls"] == "KgenDSABackend" and report["base"] == "DeepseekSparseAttnBackend"
    assert report["kgen_on"] is True, report["off_reason"]
    assert report["spec"]["model"] == dict(num_q_heads=8, kv_lora_rank=512, qk_rope_head_dim=64, softmax_scale=0.0625,
                                           index_topk=24)
    assert report["spec"]["cache"] == dict(page_size=64, kv_dtype="bfloat16") and report["spec"]["tree"] == {
        "max_nodes": 8}
    assert report["spec"]["name"] == "sglang_dsa_h8_k24_bf16_n8"  # one name per spec, process-wide


def test_the_indexer_hook_is_tree_aware_and_is_sglangs_own_selection_on_a_chain(report):
    sel = report["selection"]
    assert all(s["sglangs_is_the_chain_rule"] for s in sel.values())  # the reference models SGLang's rule
    assert all(s["tree_aware"] for s in sel.values())
    assert sel["tree"]["kind"] == "TreeIndexerMetadata" and sel["tree"]["equals_sglangs"] is False
    assert sel["chain"]["equals_sglangs"] is True and sel["decode"]["equals_sglangs"] is True
    assert sel["decode"]["kind"] == "DSAIndexerMetadata"


RUNS = ("tree", "chain", "decode", "graph0", "graph1", "graph2")


def test_verify_and_decode_run_kgens_sparse_verify_on_the_selected_lists(report):
    assert report["kgen_calls"] == {name: 1 for name in RUNS}
    assert max(report["errors"].values()) <= 1e-2, report["errors"]
    assert report["stored"] == {name: True for name in RUNS}


def test_the_graph_hooks_rewrite_fixed_buffers_and_stay_tree_aware(report):
    assert report["graph_buffers"] == [True] * 3  # the capture's buffers, rewritten for each replay
    assert all(report["selection"][f"graph{i}"]["tree_aware"] for i in range(3))


def test_calls_kgen_does_not_serve_go_to_sglangs_dsa_backend(report):
    # a sink, no top-k lists, the concatenated (non-absorbed-core) call, a mode the batch was not
    # prepared for
    assert report["routed"] == ["dsa"] * 4


def test_with_kgen_off_trees_are_refused_in_one_line(report):
    msg = report["off_with_trees"]
    assert msg.startswith("SGLangError: kgen DSA backend: kgen is off") and "\n" not in msg
    assert "verifies chains only" in msg
