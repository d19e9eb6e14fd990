"""A per-CTA timeline of one prefix / verify call (issue 19's fixed costs, bench/NOTES.md v27): when
each attention CTA started, found its work item (the split-KV schedule) and left attend(), on the
GPU's global timer and each SM's clock.

The kernels are built from a copy of templates/attention_kernels.cuh with trace points added (the
checkout's files are untouched; the patched source has its own cache key). Thread 0 of each CTA
writes its points just past req_meta in a workspace this tool makes larger than the step's.

    python -m bench.cta_trace --shape 1,16,64            # B,T,L; --tiles seesaw:32,4,1 for a tiling
"""

from __future__ import annotations

import argparse
import statistics

import torch

import kgen
from kgen import designs, render
from kgen.inputs import make_verify_inputs

HEADER = "kgen/attention_kernels.cuh"
# Each pair: an anchor of prefix_attention in the header, and what the trace puts in its place.
PATCHES = (
    ("    const WorkItem item = find_work_item<C::HEADS, C::BM, C::BN>(schedule, schedule_scratch<C>(smem));\n"
     "    if (item.b < 0) return;\n    const ItemRows r = item_rows<C>(schedule, item);\n"
     "    const int page0",
     "    KGEN_TRACE(schedule, 0);\n"
     "    const WorkItem item = find_work_item<C::HEADS, C::BM, C::BN>(schedule, schedule_scratch<C>(smem));\n"
     "    if (item.b < 0) { KGEN_TRACE(schedule, 3); return; }\n    KGEN_TRACE(schedule, 1);\n"
     "    const ItemRows r = item_rows<C>(schedule, item);\n    const int page0"),
    ("        attend<C>(smem, q_rows, r.rows, scale_log2, kv_scale, prefix, [] { return NoKeys{}; }, o, lse);\n    }\n}\n",
     "        attend<C>(smem, q_rows, r.rows, scale_log2, kv_scale, prefix, [] { return NoKeys{}; }, o, lse);\n"
     "    }\n    KGEN_TRACE(schedule, 2);\n}\n"),
)
MACRO = """
// bench/cta_trace.py: thread 0 writes (global timer, clock) of trace point P of this CTA past req_meta:
// 0 start, 1 work item found, 2 attend() done, 3 no item (words P and 4 + P of the CTA's 8).
#define KGEN_TRACE(a, P) do { if (threadIdx.x == 0) { \\
    unsigned long long* t_ = reinterpret_cast<unsigned long long*>((a).req_meta + (a).batch) + blockIdx.x * 8; \\
    unsigned long long g_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_)); \\
    t_[P] = g_; t_[4 + (P)] = clock64(); } } while (0)
"""


def traced_headers(original=render.headers):
    """render.headers with the trace points in prefix_attention (an anchor that moved is an error)."""
    def headers() -> dict[str, str]:
        hdrs = dict(original())
        text = hdrs[HEADER]
        for anchor, replacement in PATCHES:
            if text.count(anchor) != 1:
                raise RuntimeError(f"bench/cta_trace.py: its anchor in {HEADER} moved:\n{anchor}")
            text = text.replace(anchor, replacement)
        hdrs[HEADER] = text.replace("namespace kgen {", MACRO + "namespace kgen {", 1)
        return hdrs
    return headers


def summary(trace: torch.Tensor, kernel_us: float) -> list[str]:
    """What the points say: the CTAs' start spread, and per phase the median and the longest."""
    rows = [r for r in trace.view(-1, 8).cpu().tolist() if r[0]]
    with_item, without = [r for r in rows if r[2]], [r for r in rows if r[3]]
    t0 = min(r[0] for r in rows)

    def spread(values) -> str:
        return f"median {statistics.median(values):.2f}, max {max(values):.2f}" if values else "-"

    return [f"CTAs: {len(rows)} ({len(with_item)} with an item, {len(without)} without); kernel {kernel_us:.1f} us",
            f"start, us after the first CTA's: {spread([(r[0] - t0) / 1e3 for r in rows])}",
            f"schedule (start -> item), cycles: {spread([r[5] - r[4] for r in with_item])}; CTAs without an "
            f"item (start -> exit): {spread([r[7] - r[4] for r in without])}",
            f"attend (item -> attended), us: {spread([(r[2] - r[1]) / 1e3 for r in with_item])}",
            f"last CTA done, us after the first start: {max((max(r[2], r[3]) - t0) / 1e3 for r in rows):.2f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="specs/glm5_sm120.yaml")
    ap.add_argument("--shape", default="1,16,64", help="B,T,L (T = 1: a prefix call, else verify)")
    ap.add_argument("--tiles", default=None, help="a tiling instead of the plan's (e.g. seesaw:32,4,1)")
    args = ap.parse_args()
    render.headers = traced_headers()
    spec = kgen.load_spec(args.spec)
    b, t, l = (int(x) for x in args.shape.split(","))
    mod = kgen.jit(spec, tiles=designs.parse(args.tiles) if args.tiles else None)
    x = make_verify_inputs(spec, [t] * b, [l] * b, device="cuda")
    tree = None if t == 1 else x.op_mask
    size = mod.workspace_bytes(x.q.shape[0], b)
    workspace = torch.zeros(size + 64 * 4096, dtype=torch.uint8, device="cuda")  # room for 4096 CTAs' points
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, tree, num_tokens=x.q.shape[0],
                       workspace=workspace)
    call = (lambda: step.prefix(x.q, x.kv_cache, **x.kv_kwargs)) if t == 1 else \
        (lambda: step.verify(x.q, x.kv_cache, x.stored_k_tree, **x.kv_kwargs))
    call()  # the first call loads the cubins
    at = step.req_meta + 16 * b - workspace.data_ptr()  # where KGEN_TRACE writes: just past req_meta[batch]
    trace = workspace[at:at + 64 * 4096].view(torch.int64)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    trace.zero_()
    begin.record()
    call()
    end.record()
    torch.cuda.synchronize()
    print(f"{args.spec} {args.shape} {args.tiles or 'plan'}")
    print("\n".join(summary(trace, begin.elapsed_time(end) * 1e3)))


if __name__ == "__main__":
    main()
