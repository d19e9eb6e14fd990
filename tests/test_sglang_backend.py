"""The real KgenAttnBackend class, built through SGLang's attention registry on a minimal model
runner (tests/sglang_harness.py), on the CPU: TARGET_VERIFY and DECODE batches with
save_kv_cache=True, eager and through the CUDA-graph metadata hooks (capture, then padded
replays), with kgen's ops computed by kgen.reference. SGLang is the real installed package; its
Triton helper kernels (the KV-index gather) run in Triton's interpreter. It runs in a fresh
interpreter (tests/sglang_cpu_child.py): TRITON_INTERPRET must be set before triton is imported,
and importing sglang sets process-wide state. tests/test_sglang_gpu.py runs the same class with
kgen's kernels on a GPU against SGLang's TritonAttnBackend. With KGEN_DEFRAG=1 the child also
runs the opt-in defrag hook SGLang applies to ModelRunner.forward.
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

CHILD = Path(__file__).resolve().parent / "sglang_cpu_child.py"


@pytest.fixture(scope="module")
def report():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed: bash .ci/sglang_cpu.sh installs what CI runs these tests with")
    env = {**os.environ, "TRITON_INTERPRET": "1",  # and the opt-in defrag hook, on every decode step
           "KGEN_DEFRAG": "1", "KGEN_DEFRAG_INTERVAL": "1", "KGEN_DEFRAG_MIN_TOKENS": "64"}
    proc = subprocess.run([sys.executable, str(CHILD), str(SESSION_SEED)], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, f"the sglang child failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_registry_builds_kgens_backend_and_kgen_serves_the_model(report):
    assert report["cls"] == "KgenAttnBackend"
    assert report["kgen_on"] is True, report["off_reason"]
    assert report["stood_in"] in ([], ["torchvision"])  # never SGLang itself


def test_verify_and_decode_match_the_float64_reference_eager_and_through_the_graph_hooks(report):
    assert len(report["errors"]) == 12
    assert max(report["errors"]) <= 1e-2, report["errors"]
    assert report["calls"] == ["verify"] * 4 + ["prefix"] * 2 + ["verify"] * 3 + ["prefix"] * 3


def test_save_kv_cache_stores_each_new_row_at_its_slot(report):
    assert report["stored"] == [True] * 12


def test_graph_replays_refill_the_captured_buffers_and_reuse_the_prepared_step(report):
    assert report["graph_buffers_stable"] is True
    assert report["graph_step_reused"] == [True] * 6
    assert report["graph_reschedules"] == 6  # each replay's refilled lengths: the step's tables follow


def test_calls_kgen_cannot_serve_go_to_triton(report):
    # an unknown keyword passed as None stays on kgen; sinks, an unknown keyword with a value and a
    # logit-capped layer go to SGLang's Triton backend
    assert report["routed"] == ["verify"]
    assert report["triton_calls"] == ["extend"] * 3


def test_defrag_with_kgen_defrag_1_moves_fragmented_requests_into_contiguous_runs(report):
    d = report["defrag"]
    assert d["hooked"] == ["before_forward"]  # registered on ModelRunner.forward with SGLang's HookRegistry
    assert d["stats"][0]["disabled"] == "" and d["stats"][0]["moved_requests"] == 2
    assert d["contiguous"] == [True, True] and d["rows_kept"] is True and d["old_slots_free"] is True
    assert d["error"] <= 1e-2


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("no", False), ("1", True),
                                       ("yes", True)])
def test_defrag_is_off_unless_asked_for(monkeypatch, value, on):
    from kgen.integrations import sglang as integration
    from kgen.integrations import sglang_compat, sglang_defrag

    if value is None:
        monkeypatch.delenv("KGEN_DEFRAG", raising=False)
    else:
        monkeypatch.setenv("KGEN_DEFRAG", value)
    installed = []
    monkeypatch.setattr(sglang_compat, "check", lambda defrag=False: "0.5.23")
    monkeypatch.setattr(sglang_compat, "register_backend", lambda name, factory: None)
    monkeypatch.setattr(sglang_compat, "resolve_speculative_as_triton", lambda name: None)
    monkeypatch.setattr(sglang_defrag, "install", lambda: installed.append(True))
    integration.register()
    assert sglang_defrag.enabled() is on and installed == ([True] if on else [])
