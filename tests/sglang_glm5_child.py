"""Run by tests/test_sglang_glm5.py in a fresh interpreter (TRITON_INTERPRET=1, so SGLang's
Triton helper kernels, its KV-index gather and its scaled-fp8 quantizer, run on the CPU): the
real KgenAttnBackend, built through SGLang's registry on a GLM-5-shaped runner (8 heads, three
layers, SGLang's DSATokenToKVPool at page size 64 with bf16 rows, or fp8 rows with per-block
scales: argv[2] "bf16" / "fp8"), with kgen's ops computed by kgen.reference. Prints one JSON line.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_harness import Harness, RefModule, Step, key_rows, rel_l2, stand_in_missing  # noqa: E402

stood_in = stand_in_missing()

import torch  # noqa: E402

import kgen  # noqa: E402


def bridge(h: Harness, runner, backend, gen: torch.Generator) -> dict:
    """The adapter's view of the pool, whether or not kgen serves it: the rows kgen would read
    (dtype, width) and the rows it stores for new tokens (as SGLang's own writer for the pool)."""
    from kgen.integrations import sglang_compat as compat

    step = Step(h, [70, 9], 16, gen)
    step.load(runner)
    fb = step.forward_batch(runner)
    q, k, v = step.inputs("cpu")
    layer = runner.layers[1]
    compat.save_kv(backend, layer, fb, k, v)
    rows = compat.key_buffer(backend, layer)
    others = torch.ones(rows.shape[0], dtype=torch.bool)
    others[step.out_cache_loc] = False
    return dict(dtype=str(rows.dtype), shape=list(rows.shape[1:]),
                stored=bool(torch.equal(rows[step.out_cache_loc], step.stored("cpu"))),
                others_kept=bool(torch.equal(rows[:step.pool.shape[1]][others[:step.pool.shape[1]]],
                                             step.pool[1][others[:step.pool.shape[1]]])))


def to_triton(h: Harness, runner, backend, gen: torch.Generator) -> str:
    """A verify call kgen does not take (a logit-capped layer) goes to Triton; on scaled fp8 rows,
    which Triton cannot read, the backend refuses it with one line instead: that line, or ""."""
    step = Step(h, [70, 9], 4, gen)
    step.load(runner)
    fb = step.forward_batch(runner)
    backend.init_forward_metadata(fb)
    q, k, v = step.inputs("cpu")
    layer = runner.layers[2]
    layer.logit_cap = 30.0
    try:
        backend.forward(q, k, v, layer, fb, save_kv_cache=True)
        return ""
    except ValueError as e:
        return str(e)
    finally:
        layer.logit_cap = 0.0


def main(seed: int, kv: str) -> dict:
    kgen.jit = RefModule
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(major=12, minor=0)
    torch.cuda.current_device = lambda: 0
    import kgen.integrations.sglang as ks

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger(ks.__name__).addHandler(handler)
    logging.getLogger(ks.__name__).setLevel(logging.INFO)
    ks.register()
    h = Harness("cpu", max_bs=4, context_len=512, draft_tokens=16, glm5=True,
                kv_dtype=torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16)
    runner = h.runner()
    backend = h.backend("kgen", runner)
    gen = torch.Generator().manual_seed(seed)
    report = dict(stood_in=stood_in, cls=type(backend).__name__, pool=type(runner.token_to_kv_pool).__name__,
                  page_size=runner.page_size, kgen_on=backend.kgen is not None, off_reason=backend.kgen_off_reason,
                  log=[line for line in lines if line.startswith("kgen backend:")], errors=[], stored=[], meta=[])
    report["bridge"] = bridge(h, runner, backend, gen)
    report["refused"] = to_triton(h, runner, backend, gen)
    if backend.kgen is None:
        return report
    report["spec"] = backend.kgen.module.spec.name

    def run(step: Step, fb) -> None:
        """Every layer of the batch, as a model runs it: one prepared step, a forward per layer."""
        q, k, v = step.inputs("cpu", pad_to=fb.batch_size)
        for layer in runner.layers:
            out = backend.forward(q, k, v, layer, fb, save_kv_cache=True)
            rows = key_rows(runner, layer.layer_id)[step.out_cache_loc]
            report["stored"].append(bool(torch.equal(rows, step.stored("cpu"))))
            real = step.reference(layer.layer_id).shape[0]
            report["errors"].append(rel_l2(out[:real], step.reference(layer.layer_id)))

    def meta_is_the_prefix_slots(step: Step) -> bool:
        """kgen's prepared metadata: each request's prefix as its token slots (page-64 pages)."""
        qo, indptr, indices, lens = backend._kgen_step.prefix_meta
        want = [r[:length] for r, length in zip(step.rows, step.lens)]
        return (lens[:len(want)].tolist() == step.lens
                and all(torch.equal(indices[indptr[b]:indptr[b + 1]].long(), w) for b, w in enumerate(want)))

    # eager: TARGET_VERIFY with topk-4-like random trees and a chain, then DECODE
    for lens, n, chain in (([70, 0, 129], 16, False), ([300], 16, False), ([64, 5], 7, True), ([1, 200, 33], 0, False)):
        step = Step(h, lens, n, gen, chain=chain)
        step.load(runner)
        fb = step.forward_batch(runner)
        backend.init_forward_metadata(fb)
        report["meta"].append(meta_is_the_prefix_slots(step))
        # what SGLang's DSA indexer asks the backend first: None, so it picks no top-k (dense attention)
        report.setdefault("indexer_off", backend.get_indexer_metadata(0, fb) is None)
        run(step, fb)

    # the CUDA-graph hooks: capture metadata for 4 requests, then replays padded from fewer
    backend.init_cuda_graph_state(h.max_bs, h.max_bs * h.draft_tokens)
    for n in (16, 0):
        capture = Step(h, [1] * h.max_bs, n, gen)
        capture.load(runner)
        backend.init_forward_metadata_out_graph(capture.forward_batch(runner), in_capture=True)
        step0 = backend._kgen_step
        for lens in ([130, 3], [64, 1, 250]):
            step = Step(h, lens if n else [max(1, x) for x in lens], n, gen)
            step.load(runner)
            fb = step.forward_batch(runner, pad_to=h.max_bs)
            backend.init_forward_metadata_out_graph(fb)
            report.setdefault("graph_step_reused", []).append(backend._kgen_step is step0)
            report["meta"].append(meta_is_the_prefix_slots(step))
            run(step, fb)
    report["calls"] = list(backend.kgen.module.calls)
    return report


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2])))
