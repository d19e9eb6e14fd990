"""The real sglang package (0.5.23, no mocks of its classes) finds the "kgen" backend through
kgen's `sglang.srt.plugins` entry point: after SGLang's own load_plugins(), "kgen" is in its
attention registry (the dict ModelRunner resolves backend names in) and in the CLI choices of
--attention-backend / --decode-attention-backend, and the class it builds is SGLang's
TritonAttnBackend with kgen's metadata and CUDA-graph hooks in front.

It runs in a fresh interpreter, since importing sglang sets process-wide state (cache folders,
logging, transformers patches). On a CPU-only machine SGLang's model configs import torchvision,
whose PyPI wheels need a CUDA torch; where torchvision cannot be imported, the child registers a
two-name stand-in for it (after transformers has recorded that torchvision is absent) — a
stand-in for a vision library SGLang's text-model path never calls, not for SGLang.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

CHILD = textwrap.dedent('''
    import enum, importlib.machinery, json, sys, types
    try:
        import torchvision.transforms  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        import transformers, transformers.image_utils, transformers.models.auto.processing_auto  # noqa: F401,E401

        def module(name):
            m = types.ModuleType(name)
            m.__path__, m.__spec__ = [], importlib.machinery.ModuleSpec(name, None, is_package=True)
            sys.modules[name] = m
            return m

        tv, tr, fn = module("torchvision"), module("torchvision.transforms"), module("torchvision.transforms.functional")
        fn.InterpolationMode = tr.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC LANCZOS")
        tv.transforms, tr.functional = tr, fn

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
        subclass=issubclass(cls, TritonAttnBackend),
        own=sorted(k for k in ("init_forward_metadata", "init_forward_metadata_out_graph", "init_cuda_graph_state",
                               "forward_extend", "forward_decode") if getattr(cls, k) is not getattr(TritonAttnBackend, k)),
        stats=ks.defrag_stats(),
    )))
''')


@pytest.fixture(scope="module")
def report():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23 and the few imports listed in "
                    "docs/sglang.md)")
    if not any(ep.name == "kgen" for ep in entry_points(group="sglang.srt.plugins")):
        pytest.skip("kgen's sglang.srt.plugins entry point is not installed: pip install -e . again")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
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


def test_the_backend_is_sglangs_triton_backend_with_kgens_hooks(report):
    assert report["subclass"] is True
    assert report["own"] == ["forward_decode", "forward_extend", "init_cuda_graph_state", "init_forward_metadata",
                             "init_forward_metadata_out_graph"]
    assert report["stats"] == []  # no backend built in a process without a model runner
