"""The real sglang package (no mocks of its classes) finds the "kgen" backend through
kgen's `sglang.srt.plugins` entry point: after SGLang's own load_plugins(), "kgen" is in its
attention registry (the dict ModelRunner resolves backend names in) and in the CLI choices of
--attention-backend / --decode-attention-backend (the launch commands of docs/sglang.md parse),
and the class it builds is SGLang's TritonAttnBackend with kgen's metadata and CUDA-graph hooks in
front.

It runs in a fresh interpreter, since importing sglang sets process-wide state (cache folders,
logging, transformers patches). On a CPU-only machine SGLang's model configs import torchvision,
whose PyPI wheels need a CUDA torch; where torchvision cannot be imported, the child registers a
stand-in for it (tests/sglang_harness.py stand_in_missing) — for a vision library SGLang's
text-model path never calls, not for SGLang.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

CHILD = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, TESTS)
    from sglang_harness import stand_in_missing
    stand_in_missing()

    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins import load_plugins

    before = "kgen" in ATTENTION_BACKENDS or "kgen" in ATTENTION_BACKEND_CHOICES
    load_plugins()

    import argparse
    from sglang.srt.server_args import ServerArgs

    def parse(*argv):
        parser = argparse.ArgumentParser(exit_on_error=False)
        ServerArgs.add_cli_args(parser)
        try:
            ns = parser.parse_args(["--model-path", "some/model", *argv])
        except (argparse.ArgumentError, SystemExit) as e:
            return "rejected"
        return [ns.attention_backend, ns.decode_attention_backend, ns.prefill_attention_backend]

    import kgen.integrations.sglang as ks
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    cls = ks.backend_class()
    print(json.dumps(dict(
        before=before,
        factory=ATTENTION_BACKENDS.get("kgen") is ks.create_backend,
        choices="kgen" in ATTENTION_BACKEND_CHOICES,
        cli=parse("--attention-backend", "kgen"),
        cli_split=parse("--decode-attention-backend", "kgen", "--prefill-attention-backend", "triton"),
        cli_bogus=parse("--attention-backend", "no-such-backend"),
        docs=[parse(*argv) for argv in json.loads(DOC_COMMANDS)],
        subclass=issubclass(cls, TritonAttnBackend),
        own=sorted(k for k in ("init_forward_metadata", "init_forward_metadata_out_graph", "init_cuda_graph_state",
                               "forward_extend", "forward_decode") if getattr(cls, k) is not getattr(TritonAttnBackend, k)),
    )))
''')


@pytest.fixture(scope="module")
def report():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed: bash .ci/sglang_cpu.sh installs what CI runs these tests with")
    if not any(ep.name == "kgen" for ep in entry_points(group="sglang.srt.plugins")):
        pytest.skip("kgen's sglang.srt.plugins entry point is not installed: pip install -e . again")
    child = (CHILD.replace("TESTS", repr(str(Path(__file__).resolve().parent)))
             .replace("DOC_COMMANDS", repr(json.dumps(doc_commands()))))
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the sglang child failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_plugin_entry_point_registers_kgen_in_sglangs_registry(report):
    assert report["before"] is False  # nothing but SGLang's load_plugins() put it there
    assert report["factory"] is True
    assert report["choices"] is True


def test_sglangs_cli_accepts_kgen_for_attention_and_decode(report):
    assert report["cli"] == ["kgen", None, None]
    assert report["cli_split"] == [None, "kgen", "triton"]
    assert report["cli_bogus"] == "rejected"


def doc_commands() -> list[list[str]]:
    """The arguments of every `python -m sglang.launch_server` command in docs/sglang.md."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "sglang.md").read_text()
    blocks = re.findall(r"python -m sglang\.launch_server \\\n(.*?)\n```", text, re.S)
    return [shlex.split(block.replace("\\\n", " ")) for block in blocks]


def test_the_documented_launch_commands_parse(report):
    assert len(report["docs"]) == 3  # GLM-5 on sm_90 and on sm_120, DeepSeek-V3
    assert all(args[:3] == ["kgen", None, None] for args in report["docs"]), report["docs"]


def test_the_backend_is_sglangs_triton_backend_with_kgens_hooks(report):
    assert report["subclass"] is True
    assert report["own"] == ["forward_decode", "forward_extend", "init_cuda_graph_state", "init_forward_metadata",
                             "init_forward_metadata_out_graph"]
