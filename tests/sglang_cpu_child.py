"""Run by tests/test_sglang_backend.py in a fresh interpreter (TRITON_INTERPRET=1, so SGLang's
Triton helper kernels run on the CPU): the real KgenAttnBackend, built through SGLang's
registry on a harness runner, with kgen's ops computed by kgen.reference. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_harness import Harness, RefModule, Step, rel_l2, stand_in_missing  # noqa: E402

stood_in = stand_in_missing()

import torch  # noqa: E402

import kgen  # noqa: E402


def defrag_pass(h: Harness, gen: torch.Generator) -> dict:
    """KGEN_DEFRAG=1 (set by the parent): the hook SGLang applies to ModelRunner.forward, run on a
    decode batch of two long fragmented requests: their KV moves into contiguous runs, req_to_token
    follows, the old slots are free again, and attention reads the same values."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from kgen.integrations import sglang_defrag

    runner = h.runner()
    runner.attn_backend = h.backend("kgen", runner)
    step = Step(h, [200, 180], 0, gen, within=h.max_bs * h.context_len // 2)  # the upper half stays free
    step.load(runner)
    allocator = runner.token_to_kv_pool_allocator
    used = torch.cat(step.rows)
    allocator.free_pages = allocator.free_pages[~torch.isin(allocator.free_pages, used)]
    before = [runner.token_to_kv_pool.get_key_buffer(0)[r[:-1]].clone() for r in step.rows]
    fb = step.forward_batch(runner)
    sglang_defrag.before_forward(runner, fb)  # what the installed hook calls first
    table = runner.req_to_token_pool.req_to_token
    moved = [table[b + 1, :len(r) - 1].long() for b, r in enumerate(step.rows)]
    runner.attn_backend.init_forward_metadata(fb)
    q, k, v = step.inputs("cpu")
    out = runner.attn_backend.forward(q, k, v, runner.layer, fb, save_kv_cache=True)
    free = torch.cat([allocator.free_pages, allocator.release_pages])
    return dict(
        hooked=[getattr(hook, "__name__", "") for _, hook, _ in HookRegistry._hooks.get(sglang_defrag.TARGET, [])],
        stats=sglang_defrag.stats(),
        contiguous=[bool((m[1:] == m[:-1] + 1).all()) for m in moved],
        rows_kept=all(torch.equal(runner.token_to_kv_pool.get_key_buffer(0)[m], b) for m, b in zip(moved, before)),
        old_slots_free=bool(torch.isin(torch.cat([r[:-1] for r in step.rows]), free).all()),
        error=rel_l2(out, step.reference()))


def main() -> dict:
    kgen.jit = RefModule
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(major=12, minor=0)
    torch.cuda.current_device = lambda: 0
    import kgen.integrations.sglang as ks
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    ks.register()
    h = Harness("cpu", max_bs=4, context_len=256, draft_tokens=16)
    runner = h.runner()
    backend = h.backend("kgen", runner)
    layer, gen = runner.layer, torch.Generator().manual_seed(int(sys.argv[1]))
    report = dict(stood_in=stood_in, cls=type(backend).__name__, kgen_on=backend.kgen is not None,
                  off_reason=backend.kgen_off_reason, errors=[], stored=[], triton_calls=[])

    to_triton = report["triton_calls"]
    TritonAttnBackend.forward_extend = lambda self, *a, **kw: to_triton.append("extend")
    TritonAttnBackend.forward_decode = lambda self, *a, **kw: to_triton.append("decode")

    def run(step: Step, fb, **kwargs):
        q, k, v = step.inputs("cpu", pad_to=fb.batch_size)
        out = backend.forward(q, k, v, layer, fb, save_kv_cache=True, **kwargs)
        rows = runner.token_to_kv_pool.get_key_buffer(0)[step.out_cache_loc]
        report["stored"].append(bool(torch.equal(rows.view(torch.int16), step.k.view(torch.int16))))
        real = step.reference().shape[0]
        report["errors"].append(rel_l2(out[:real], step.reference()))

    # eager: TARGET_VERIFY (random trees, a chain) and DECODE
    for lens, n, chain in (([5, 0, 37], 4, False), ([100], 16, False), ([3, 60, 1, 200], 7, True), ([9, 1], 1, False)):
        step = Step(h, lens, n, gen, chain=chain)
        step.load(runner)
        fb = step.forward_batch(runner)
        backend.init_forward_metadata(fb)
        run(step, fb)
    for lens in ([1, 30, 7], [250]):
        step = Step(h, lens, 0, gen)
        step.load(runner)
        fb = step.forward_batch(runner)
        backend.init_forward_metadata(fb)
        run(step, fb)

    # the CUDA-graph hooks: capture metadata for 4 requests, then replays padded from fewer
    backend.init_cuda_graph_state(h.max_bs, h.max_bs * h.draft_tokens)
    addresses = set()
    for n in (8, 0):
        capture = Step(h, [1] * h.max_bs, n, gen)
        capture.load(runner)
        backend.init_forward_metadata_out_graph(capture.forward_batch(runner), in_capture=True)
        step0 = backend._kgen_step
        for lens in ([40, 3], [200, 17, 1, 64], [77]):
            step = Step(h, lens if n else [max(1, x) for x in lens], n, gen)
            step.load(runner)
            fb = step.forward_batch(runner, pad_to=h.max_bs)
            backend.init_forward_metadata_out_graph(fb)
            addresses.add(tuple(t.data_ptr() for t in backend.kgen.graph.values()))
            report.setdefault("graph_step_reused", []).append(backend._kgen_step is step0)
            run(step, fb)

    report["graph_buffers_stable"] = len(addresses) == 1
    report["graph_reschedules"] = backend.kgen.module.reschedules
    report["calls"] = list(backend.kgen.module.calls)

    # routing: layers and calls kgen does not serve go to Triton
    step = Step(h, [20, 5], 4, gen)
    step.load(runner)
    fb = step.forward_batch(runner)
    backend.init_forward_metadata(fb)
    q, k, v = step.inputs("cpu")
    backend.forward(q, k, v, layer, fb, save_kv_cache=True, future_keyword=None)  # an unknown keyword, unused: kgen
    backend.forward(q, k, v, layer, fb, save_kv_cache=True, sinks=torch.zeros(h.heads))
    backend.forward(q, k, v, layer, fb, save_kv_cache=True, future_keyword=object())
    layer.logit_cap = 30.0
    backend.forward(q, k, v, layer, fb, save_kv_cache=True)
    layer.logit_cap = 0.0
    report["routed"] = backend.kgen.module.calls[len(report["calls"]):]
    report["defrag"] = defrag_pass(h, gen)
    return report


if __name__ == "__main__":
    print(json.dumps(main()))
