"""GLM-5 (GlmMoeDsaForCausalLM) in SGLang with `--attention-backend kgen`, on the CPU, against the
real installed sglang:

- server-arg resolution (tests/sglang_resolve_child.py): a GLM-5-shaped local config with an EAGLE
  tree (topk 4) resolves with kgen on the verify and decode path and the draft on Triton, at the
  page size (64) and KV dtype SGLang's DSA defaults give each GPU; without kgen's resolution hook
  SGLang's own check refuses the same arguments;
- `python -m sglang.launch_server --help` lists kgen;
- the real KgenAttnBackend built through SGLang's registry on a GLM-5-shaped runner
  (tests/sglang_glm5_child.py: DSATokenToKVPool at page size 64, three layers, 8 heads):
  TARGET_VERIFY with random trees and a chain, DECODE, eager and through the CUDA-graph hooks,
  every layer, with kgen's ops computed by kgen.reference; its metadata, routing, log line and
  stored rows. bf16 rows, and fp8 rows with per-block scales (kgen serves them once its specs
  have cache.scales; until then the backend says so and hands them to Triton).

Each part runs in a fresh interpreter (importing sglang sets process-wide state; the backend
children need TRITON_INTERPRET=1 before triton is imported). tests/test_sglang_backend_gpu.py runs
the same backend with kgen's kernels on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SESSION_SEED
from test_sglang_registry import doc_commands

TESTS = Path(__file__).resolve().parent
TOL = 1e-2


def child(*argv: str, interpret: bool = False) -> dict:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (CI installs it: .ci/run)")
    env = {**os.environ, **({"TRITON_INTERPRET": "1"} if interpret else {})}
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"the sglang child failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- server-arg resolution and the CLI ---------------------------------------------------------


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    glm5 = [args for args in doc_commands() if args[args.index("--model-path") + 1] == "zai-org/GLM-5"]
    assert len(glm5) == 2  # docs/sglang.md: sm_90, then sm_120
    return child(str(TESTS / "sglang_resolve_child.py"), str(tmp_path_factory.mktemp("glm5") / "config"),
                 json.dumps(glm5))


def test_without_kgens_resolution_hook_sglang_refuses_a_tree_at_page_size_64(resolved):
    assert "speculative_eagle_topk > 1 with page_size > 1 is only supported" in resolved["unhooked"]["error"]


@pytest.mark.parametrize("gpu, kv", [("sm120", "fp8_e4m3"), ("sm90", "bfloat16")])
def test_glm5_with_kgen_and_an_eagle_tree_resolves_with_kgen_verifying_and_triton_drafting(resolved, gpu, kv):
    got = resolved[gpu]
    assert "error" not in got, got
    assert got["attention_backend"] == "kgen" and got["verify_and_decode"] == ["kgen", "kgen"]
    assert got["speculative_attention_mode"] == "prefill"  # TARGET_VERIFY on the prefill backend: kgen
    assert got["draft_backend"] == "triton"
    assert (got["page_size"], got["kv_cache_dtype"]) == (64, kv)  # SGLang's DSA defaults for that GPU
    assert (got["topk"], got["draft_tokens"]) == (4, 16)


def test_a_draft_backend_the_user_names_is_kept_and_page_size_stays_64(resolved):
    assert resolved["sm90_flashinfer_draft"]["draft_backend"] == "flashinfer"
    assert resolved["sm90_page1"]["page_size"] == 64  # the DSA override, whatever --page-size says


def test_the_hook_leaves_other_backends_resolution_alone(resolved):
    got = resolved["sm90_triton"]
    assert got["attention_backend"] == "triton" and got["draft_backend"] is None


def test_the_resolution_hook_registers_once_and_a_refusal_is_one_line():
    pytest.importorskip("sglang", reason="sglang is not installed (CI installs it: .ci/run)")
    from kgen.integrations import sglang_compat as compat

    code = ("import sys; sys.path.insert(0, TESTS); from sglang_harness import stand_in_missing; stand_in_missing()\n"
            "from sglang.srt.arg_groups import resolution_hooks as rh\n"
            "from kgen.integrations import sglang as ks, sglang_compat as compat\n"
            "ks.register(); ks.register()\n"
            "print(len(rh._HOOKS['handle_speculative_decoding']))\n"
            "rh.register_resolution_hook = lambda name: (_ for _ in ()).throw(ValueError('a long list'))\n"
            "try:\n    compat.resolve_speculative_as_triton.__wrapped__('kgen2')\n"
            "except compat.SGLangError as e:\n    print(e)\n").replace("TESTS", repr(str(TESTS)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, msg = proc.stdout.strip().splitlines()[-2:]
    assert count == "1"
    assert msg.startswith("sglang 0.5.2") and "handle_speculative_decoding is not an overridable" in msg
    assert compat.SUPPORTED[-1] in msg


@pytest.mark.parametrize("gpu, kv", [("sm90", "bfloat16"), ("sm120", "fp8_e4m3")])
def test_the_documented_glm5_commands_resolve_as_the_docs_say(resolved, gpu, kv):
    got = resolved[f"docs_{gpu}"]
    assert "error" not in got, got
    assert got["verify_and_decode"] == ["kgen", "kgen"] and got["draft_backend"] == "triton"
    assert (got["page_size"], got["kv_cache_dtype"], got["topk"]) == (64, kv, 4)
    if gpu == "sm120":  # the flags that keep Triton off the scaled rows (a captured prefill would run as MLA)
        assert got["draft_kv_cache_dtype"] == "bf16" and got["radix_cache"] is False
        assert got["chunked_prefill_size"] == -1 and got["prefill_graph"] == "disabled"


def test_launch_server_help_lists_kgen():
    # the real `python -m sglang.launch_server --help` (with the torchvision stand-in a CPU machine needs)
    code = (f"import runpy, sys; sys.path.insert(0, {str(TESTS)!r}); from sglang_harness import stand_in_missing; "
            "stand_in_missing(); sys.argv = ['launch_server', '--help']; "
            "runpy.run_module('sglang.launch_server', run_name='__main__')")
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (CI installs it: .ci/run)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    choices = next(line for line in proc.stdout.splitlines() if line.strip().startswith("--attention-backend {"))
    assert ",kgen" in choices or "{kgen" in choices, choices


# ---- the backend on GLM-5's DSA pool --------------------------------------------------------------


@pytest.fixture(scope="module", params=["bf16", "fp8"])
def glm5(request):
    return request.param, child(str(TESTS / "sglang_glm5_child.py"), str(SESSION_SEED), request.param, interpret=True)


def scaled_rows_supported() -> bool:
    from kgen.spec import CacheSpec

    return "scales" in CacheSpec.model_fields


def served(glm5) -> dict:
    kv, report = glm5
    if kv == "fp8" and not scaled_rows_supported():
        assert report["kgen_on"] is False and "cache.scales" in report["off_reason"]
        assert report["log"] == [f"kgen backend: every mode runs on SGLang's Triton backend ({report['off_reason']})"]
        pytest.skip("this kgen has no fp8 rows with per-block scales yet (cache.scales): the backend says so, "
                    "checked above")
    assert report["kgen_on"] is True, report["off_reason"]
    return report


def test_the_adapter_reads_and_writes_the_pools_rows_as_sglang_stores_them(glm5):
    kv, report = glm5
    assert report["cls"] == "KgenAttnBackend" and report["stood_in"] in ([], ["torchvision"])
    assert (report["pool"], report["page_size"]) == ("DSATokenToKVPool", 64)
    b = report["bridge"]
    assert (b["dtype"], b["shape"]) == (("torch.uint8", [1, 656]) if kv == "fp8" else ("torch.bfloat16", [1, 576]))
    assert b["stored"] is True and b["others_kept"] is True  # fp8: byte-equal to SGLang's own quantizer


def test_calls_triton_would_get_on_scaled_rows_are_refused_with_one_line(glm5):
    kv, report = glm5
    if kv == "bf16":
        assert report["refused"] == ""  # a logit-capped layer: SGLang's Triton backend serves it
    else:
        msg = report["refused"]
        assert "\n" not in msg and "TARGET_VERIFY call of layer 2" in msg and "--kv-cache-dtype bf16" in msg, msg


def test_the_log_line_names_the_pool_rows_page_size_and_dense_attention(glm5):
    report, kv = served(glm5), glm5[0]
    rows = "fp8 e4m3 rows with per-block scales [slots, 656] uint8" if kv == "fp8" else "bf16 rows [slots, 576]"
    kv_name = "fp8_pb" if kv == "fp8" else "bf16"
    assert re.fullmatch(rf"sglang_h8_n16_{kv_name}_[0-9a-f]{{8}}", report["spec"]), report["spec"]
    assert report["log"] == [f"kgen backend: TARGET_VERIFY and DECODE run on kgen ({report['spec']}) over SGLang's "
                             f"DSATokenToKVPool, {rows}, page size 64; dense attention (DSA indexer off: every token "
                             f"attends to its whole prefix)"]
    assert report["indexer_off"] is True  # SGLang's DSA indexer gets no metadata from this backend


def test_verify_with_trees_and_decode_match_the_reference_on_every_layer_eager_and_replayed(glm5):
    report = served(glm5)
    assert len(report["errors"]) == 3 * 8 and max(report["errors"]) <= TOL, report["errors"]
    assert report["calls"] == (["verify"] * 9 + ["prefix"] * 3 + ["verify"] * 6 + ["prefix"] * 6)
    assert report["stored"] == [True] * 24  # each new row at its slot, as SGLang's writer for the pool stores it


def test_kgens_metadata_is_each_requests_prefix_slots_and_graph_replays_reuse_the_captured_step(glm5):
    report = served(glm5)
    assert report["meta"] == [True] * 8
    assert report["graph_step_reused"] == [True] * 4


def test_each_derived_spec_has_its_own_name():
    """kgen registers its ops per spec name: two models of one process must not share one."""
    from kgen.integrations.sglang import runtime_spec_name

    def data(scale=0.0625, heads=8, cache=None):
        return dict(model=dict(num_q_heads=heads, kv_lora_rank=512, qk_rope_head_dim=64, softmax_scale=scale),
                    cache=cache or dict(page_size=1, kv_dtype="bfloat16"), tree=dict(max_nodes=16),
                    target=dict(arch="sm_90"))

    names = {runtime_spec_name(d) for d in (
        data(), data(scale=0.1352), data(heads=16),
        data(cache=dict(page_size=1, kv_dtype="float8_e4m3fn")),
        data(cache=dict(page_size=1, kv_dtype="float8_e4m3fn", scales="per_block")))}
    assert len(names) == 5 and runtime_spec_name(data()) == runtime_spec_name(data())
    assert all(re.fullmatch(r"sglang_h(8|16)_n16_(bf16|fp8|fp8_pb)_[0-9a-f]{8}", n) for n in names), names
