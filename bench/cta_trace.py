"""A per-CTA timeline of one prefix / verify call (issue 19's fixed costs, bench/NOTES.md v27) or of
one sparse verify call (issue 21's): when each attention CTA started, found its work item (the
split-KV schedule), built its key list (sparse) and left attend(), on the GPU's global timer and
each SM's clock.

The kernels are built from copies of the attention headers with trace points added (the checkout's
files are untouched; the patched source has its own cache key). Thread 0 of each CTA writes its
points into TRACE_BYTES that this tool places just before the step's workspace.

    python -m bench.cta_trace --shape 1,16,64            # B,T,L; --tiles seesaw:32,4,1 for a tiling
    python -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072 [--empty-lists]

On the seesaw loop (the sm_90 plan's dense kernels) it also sums, per consumer, the cycles of each
step of a tile pair that can wait on the other consumer or on the ring (issue 19's pair chain); the
atomics that sum them add a little to each pair.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import kgen
from kgen import designs, render
from kgen.inputs import make_verify_inputs
from kgen.sparse_testing import make_sparse_inputs
from kgen.step import Step

HEADER = "kgen/attention_kernels.cuh"
# Per header, pairs of an anchor and what the trace puts in its place. The points: 0 start, 1 work
# item found, 2 attend() done, 3 no item (exit), 4 Q in registers, 5 first key range done, 6 second
# (the tree) done, 7 the dense schedule's chunk chosen or the sparse key list built; in the mma.sync
# loop 8 its barriers set up (Q's wait next); in the sparse kernels 9 the schedule's sums done, and
# per union round (the last round's stay) 15 its start, 10 the set cleared, 13 thread 0's last step of
# entries loaded, tested and queued (its inserts next), 11 the entries scanned, 12 the list written,
# and 14 Q's copies issued (the sparse kernels). 4-6 and 8 in the mma.sync loop (attention.cuh), where
# thread 0 is a compute thread, and in the seesaw loop, where 4-6 are consumer 0's (thread 128: thread 0
# is a producer's), 8 the ring set up and 13 consumer 0's partial state written. Point 2 follows a
# barrier: the CTA's last thread is done.
PATCHES = {
    HEADER: (
        ("    const WorkItem item = find_work_item<C::HEADS, C::BM, C::BN, C::CLUSTER>(schedule, schedule_scratch<C>(smem));\n"
         "    if (item.b < 0) return;\n    const ItemRows r = item_rows<C>(schedule, item);\n"
         "    const int page0",
         "    KGEN_TRACE_START(part_o);\n"
         "    const WorkItem item = find_work_item<C::HEADS, C::BM, C::BN, C::CLUSTER>(schedule, schedule_scratch<C>(smem));\n"
         "    if (item.b < 0) { KGEN_TRACE(3); return; }\n    KGEN_TRACE(1);\n"
         "    const ItemRows r = item_rows<C>(schedule, item);\n    const int page0"),
        ("        attend<C>(smem, q_rows, r.attended(), scale_log2, kv_scale, prefix, [] { return NoKeys{}; }, o, lse);\n    }\n}\n",
         "        attend<C>(smem, q_rows, r.attended(), scale_log2, kv_scale, prefix, [] { return NoKeys{}; }, o, lse);\n"
         "    }\n    __syncthreads();\n    KGEN_TRACE(2);\n}\n"),
    ),
    "kgen/sparse_attention.cuh": (
        ("    const SparseItem item = find_sparse_item<C::HEADS, C::BM>(a, schedule_table, schedule_scratch<C>(smem));\n"
         "    if (item.b < 0) return;\n",
         "    KGEN_TRACE_START(part_o);\n"
         "    const SparseItem item = find_sparse_item<C::HEADS, C::BM>(a, schedule_table, schedule_scratch<C>(smem));\n"
         "    if (item.b < 0) { KGEN_TRACE(3); return; }\n    KGEN_TRACE(1);\n"),
        ("        fence_proxy_async();\n        __syncthreads();\n",  # the union's list built (the gather builds none)
         "        KGEN_TRACE(7);\n        fence_proxy_async();\n        __syncthreads();\n"),
        ("    if constexpr (C::Q_APART) copy_item_q<C>(smem, q, a, item);\n",
         "    if constexpr (C::Q_APART) copy_item_q<C>(smem, q, a, item);\n    KGEN_TRACE(14);\n"),
        ("            if ((passed >> u) & 1u) sts_u32(queue + 4 * at++, slot[u]);\n        __syncwarp();\n",
         "            if ((passed >> u) & 1u) sts_u32(queue + 4 * at++, slot[u]);\n        __syncwarp();\n"
         "        KGEN_TRACE(13);\n"),
        ("    set.clear();\n    __syncthreads();\n",
         "    KGEN_TRACE(15);\n    set.clear();\n    __syncthreads();\n    KGEN_TRACE(10);\n"),
        ("        __syncwarp();  // the queue is read before the next step writes it\n    }\n    __syncthreads();\n",
         "        __syncwarp();  // the queue is read before the next step writes it\n    }\n    KGEN_TRACE(11);\n"
         "    __syncthreads();\n"),
        ("    return fits ? set.compact(list) : -1;\n",
         "    const int listed = fits ? set.compact(list) : -1;\n    KGEN_TRACE(12);\n    return listed;\n"),
        ("    launch_dependents();\n}\n", "    __syncthreads();\n    KGEN_TRACE(2);\n    launch_dependents();\n}\n"),
    ),
    "kgen/sparse_schedule.cuh": (
        ("    const long long row_tiles = block_reduce<Sum>(my_tiles, sums);\n",
         "    const long long row_tiles = block_reduce<Sum>(my_tiles, sums);\n    KGEN_TRACE(9);\n"),
    ),
    # The seesaw loop's pair (issue 19): per consumer, the cycles spent in each step of a pair that can
    # wait on the other consumer or the ring, summed over the CTA's pairs (accumulators, not points).
    "kgen/attention_seesaw.cuh": (
        ("    ss_scores<C>(smem, st, d, pos, s);\n", "    KGEN_TRACE_WAIT(0, ss_scores<C>(smem, st, d, pos, s));\n"),
        ("    named_barrier(C::MAX1_BAR, 256);  // consumer 1's m1 and beta\n",
         "    KGEN_TRACE_WAIT(1, named_barrier(C::MAX1_BAR, 256));  // consumer 1's m1 and beta\n    KGEN_TRACE_COUNT(15);\n"),
        ("    wgmma_wait<0>();  // O_lo += P_a V_a is done: O is free\n",
         "    KGEN_TRACE_WAIT(2, wgmma_wait<0>());  // O_lo += P_a V_a is done: O is free\n"),
        ("    ss_wait_full<C>(smem, pos + 1);\n    named_barrier(C::P1_BAR, 256);  // consumer 1's P_b\n",
         "    KGEN_TRACE_WAIT(3, ss_wait_full<C>(smem, pos + 1));\n"
         "    KGEN_TRACE_WAIT(4, named_barrier(C::P1_BAR, 256));  // consumer 1's P_b\n"),
        ("    ss_issue_pv_shared<C>(st, d, pos + 1, d.p[1]);\n    wgmma_wait<0>();\n",
         "    ss_issue_pv_shared<C>(st, d, pos + 1, d.p[1]);\n    KGEN_TRACE_WAIT(5, wgmma_wait<0>());\n"),
        ("    ss_scores<C>(smem, st, d, pos + 1, s);\n", "    KGEN_TRACE_WAIT(8, ss_scores<C>(smem, st, d, pos + 1, s));\n"),
        ("    named_barrier(C::MAX0_BAR, 256);  // consumer 0's m0 and alpha\n",
         "    KGEN_TRACE_WAIT(9, named_barrier(C::MAX0_BAR, 256));  // consumer 0's m0 and alpha\n"),
        ("    ss_wait_full<C>(smem, pos);\n    named_barrier(C::P0_BAR, 256);  // consumer 0's beta P_a\n",
         "    KGEN_TRACE_WAIT(10, ss_wait_full<C>(smem, pos));\n"
         "    KGEN_TRACE_WAIT(11, named_barrier(C::P0_BAR, 256));  // consumer 0's beta P_a\n"),
        ("    wgmma_wait<1>();\n    wg_release(ring_empty<C>(smem, (pos + 1) % C::STAGES));\n    wgmma_wait<0>();\n",
         "    KGEN_TRACE_WAIT(12, wgmma_wait<1>());\n    wg_release(ring_empty<C>(smem, (pos + 1) % C::STAGES));\n"
         "    KGEN_TRACE_WAIT(12, wgmma_wait<0>());\n"),
        # each consumer's whole pair, so the untraced steps (softmax, rescales, P packing) show too
        ("            ss_first_pair<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2);\n",
         "            KGEN_TRACE_WAIT(6, ss_first_pair<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2));\n"),
        ("            ss_second_pair<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2);\n",
         "            KGEN_TRACE_WAIT(13, ss_second_pair<C>(smem, st, d, pos0 + tile, tile, num_keys, visible, scale_log2));\n"),
        # consumer 0's timeline (its first thread, 128): Q staged, the first range, the second, its
        # partial state written; and the ring set up (thread 0, a producer's)
        ("                [](int slab) { return 64 * slab; });\n",
         "                [](int slab) { return 64 * slab; });\n    KGEN_TRACE_AT(4, 128);\n"),
        ("    ss_consume<C, ROLE>(smem, st, ring_pos, first.num_keys, first.visible, first.tile_begin, first.tile_end, scale_log2);\n",
         "    ss_consume<C, ROLE>(smem, st, ring_pos, first.num_keys, first.visible, first.tile_begin, first.tile_end, scale_log2);\n"
         "    KGEN_TRACE_AT(5, 128);\n"),
        ("    ss_end<C, ROLE>(smem, st, part_o, part_lse, PER_TENSOR ? kv_scale : 1.f);\n",
         "    KGEN_TRACE_AT(6, 128);\n    ss_end<C, ROLE>(smem, st, part_o, part_lse, PER_TENSOR ? kv_scale : 1.f);\n"
         "    KGEN_TRACE_AT(13, 128);\n"),
        # the epilogue's row-sum exchange: each consumer's wait for the other (accumulators 7 and 14)
        ("        named_barrier(C::EXCHANGE_BAR, 256);\n        return sum + *row_value<C>(smem, C::SUM1 - ROLE, r);\n",
         "        KGEN_TRACE_WAIT(7 * ROLE + 7, named_barrier(C::EXCHANGE_BAR, 256));\n"
         "        return sum + *row_value<C>(smem, C::SUM1 - ROLE, r);\n"),
        ("    char* smem = wg_setup<C>(smem_raw, C::KV_SCALED ? 2 * 128 : 128);\n",
         "    char* smem = wg_setup<C>(smem_raw, C::KV_SCALED ? 2 * 128 : 128);\n    KGEN_TRACE(8);\n"),
    ),
    "kgen/schedule.cuh": (
        ("    const SplitRule rule = choose_split<HEADS, BM, BN, GROUP>(a, total_work, longest, shortest, rows, sc);\n",
         "    const SplitRule rule = choose_split<HEADS, BM, BN, GROUP>(a, total_work, longest, shortest, rows, sc);\n"
         "    KGEN_TRACE(7);\n"),
    ),
    "kgen/attention.cuh": (
        ("        mbar_init_fence();\n    }\n    __syncthreads();\n    st.ring_pos = 0;\n",
         "        mbar_init_fence();\n    }\n    __syncthreads();\n    KGEN_TRACE(8);\n    st.ring_pos = 0;\n"),
        ("    attend_begin<C>(smem, st, q_rows, num_rows, scale_log2, kv_scale);\n",
         "    attend_begin<C>(smem, st, q_rows, num_rows, scale_log2, kv_scale);\n    KGEN_TRACE(4);\n"),
        ("    attend_range<C>(smem, st, first.keys, first.num_keys, first.visible, first.tile_begin, first.tile_end);\n",
         "    attend_range<C>(smem, st, first.keys, first.num_keys, first.visible, first.tile_begin, first.tile_end);\n"
         "    KGEN_TRACE(5);\n"),
        ("        attend_range<C>(smem, st, second.keys, second.num_keys, second.visible, second.tile_begin, second.tile_end);\n",
         "        attend_range<C>(smem, st, second.keys, second.num_keys, second.visible, second.tile_begin, second.tile_end);\n"
         "    KGEN_TRACE(6);\n"),
        # the tile timeline: when thread 0 has each of a CTA's first TIMELINE tiles (its full-barrier wait
        # done), and when the producer warp has issued each one's copies
        ("        const int stage = ring_wait_full<C>(smem, st.ring_pos);\n",
         "        const int stage = ring_wait_full<C>(smem, st.ring_pos);\n        KGEN_TRACE_TILE(0, st.ring_pos, 0);\n"),
        ("            bulk_copy(dst, keys.row(row.j, row.fetched), C::KV_ROW, ring_full<C>(smem, stage));\n        }\n    }\n}\n",
         "            bulk_copy(dst, keys.row(row.j, row.fetched), C::KV_ROW, ring_full<C>(smem, stage));\n        }\n"
         "        __syncwarp();\n        KGEN_TRACE_TILE(TIMELINE, st.ring_pos, C::CONSUMERS);\n    }\n}\n"),
    ),
}
POINTS = 16
# the seesaw pair's accumulators (consumer 0: 0-7, consumer 1: 8-14, pairs: 15), or the mma.sync loop's
# tile timeline (0-6: thread 0 has tile i, 7-13: the producer issued tile i's copies)
WAITS = 16
TIMELINE = 7  # tiles a CTA's timeline follows
STRIDE = 2 * POINTS + WAITS  # words a CTA
TRACE_CTAS = 4096  # the most CTAs a traced call may have
TRACE_BYTES = TRACE_CTAS * STRIDE * 8
MACRO = """
// bench/cta_trace.py: thread 0 (KGEN_TRACE_AT: thread T) writes (global timer, clock) of trace
// point P of this CTA into the TRACE_BYTES just before the step's workspace, i.e. before part_o
// (words P and POINTS + P of the CTA's STRIDE); KGEN_TRACE_START publishes where, for the points in
// callees. KGEN_TRACE_WAIT adds
// the cycles its statement took to accumulator W (word 2 POINTS + W), from the first thread of each
// warpgroup (a seesaw consumer's: the producer never runs them); KGEN_TRACE_COUNT counts in one.
// KGEN_TRACE_TILE: thread T writes the global timer at ring position POS < TIMELINE into word
// 2 POINTS + BASE + POS (the mma.sync loop's tile timeline).
__device__ unsigned long long* kgen_trace_base;
__device__ __forceinline__ unsigned long long kgen_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define KGEN_TRACE_START(part_o) do { if (threadIdx.x == 0) \\
    kgen_trace_base = reinterpret_cast<unsigned long long*>(part_o) - TRACE_CTAS * STRIDE; KGEN_TRACE(0); } while (0)
#define KGEN_TRACE(P) KGEN_TRACE_AT(P, 0)
#define KGEN_TRACE_AT(P, T) do { if (threadIdx.x == (T) && kgen_trace_base) { /* none: split_schedule */ \\
    unsigned long long* t_ = kgen_trace_base + blockIdx.x * STRIDE; \\
    t_[P] = kgen_globaltimer(); t_[POINTS + (P)] = clock64(); } } while (0)
#define KGEN_TRACE_WAIT(W, ...) do { const long long c0_ = clock64(); __VA_ARGS__; \\
    if (threadIdx.x % 128 == 0 && kgen_trace_base) \\
        atomicAdd(kgen_trace_base + blockIdx.x * STRIDE + 2 * POINTS + (W), (unsigned long long)(clock64() - c0_)); } while (0)
#define KGEN_TRACE_TILE(BASE, POS, T) do { if (threadIdx.x == (T) && kgen_trace_base && (POS) < TIMELINE) \\
    kgen_trace_base[blockIdx.x * STRIDE + 2 * POINTS + (BASE) + (POS)] = kgen_globaltimer(); } while (0)
#define KGEN_TRACE_COUNT(W) do { if (threadIdx.x % 128 == 0 && kgen_trace_base) \\
    atomicAdd(kgen_trace_base + blockIdx.x * STRIDE + 2 * POINTS + (W), 1ull); } while (0)
constexpr int TRACE_CTAS = """ + str(TRACE_CTAS) + """, POINTS = """ + str(POINTS) + """, STRIDE = """ + str(STRIDE) + """;
constexpr int TIMELINE = """ + str(TIMELINE) + """;
"""


def traced_headers(original=render.headers):
    """render.headers with the trace points (an anchor that moved is an error); the macros go into
    common.cuh, which every header includes first."""
    def headers() -> dict[str, str]:
        hdrs = dict(original())
        for name, patches in PATCHES.items():
            text = hdrs[name]
            for anchor, replacement in patches:
                if text.count(anchor) != 1:
                    raise RuntimeError(f"bench/cta_trace.py: its anchor in {name} moved:\n{anchor}")
                text = text.replace(anchor, replacement)
            hdrs[name] = text
        common = "kgen/common.cuh"
        hdrs[common] = hdrs[common].replace("namespace kgen {", MACRO + "namespace kgen {", 1)
        return hdrs
    return headers


# The seesaw pair's steps each consumer's accumulators time (KGEN_TRACE_WAIT; "" = unused).
PAIR_STEPS_0 = ("Q.K a (with its ring wait)", "MAX1 barrier", "O free (P.V a done)", "ring wait b", "P1 barrier",
                "P.V b", "whole pair", "")
PAIR_STEPS_1 = ("Q.K b (with its ring wait)", "MAX0 barrier", "ring wait a", "P0 barrier", "P.V waits", "whole pair",
                "", "")
PHASES = (("schedule: lengths, sums, chunk", 0, 7), ("schedule: scan to the item", 7, 1), ("Q to registers", 1, 4),
          ("first range (prefix)", 4, 5), ("second range (tree)", 5, 6), ("partial state", 6, 2),
          ("seesaw consumer 0: its partial state (ss_end)", 6, 13))
SPARSE_PHASES = (("schedule: sums, chunk", 0, 9), ("schedule: scan to the item", 9, 1),
                 ("Q's copies issued", 1, 14), ("key list: to build_union", 14, 15),
                 ("key list: set cleared", 15, 10), ("key list: scan to the last step's queue (thread 0)", 10, 13),
                 ("key list: that step's inserts (thread 0)", 13, 11), ("key list: entries scanned", 10, 11),
                 ("key list: list written", 11, 12), ("key list: to its end", 12, 7), ("key list (all)", 1, 7),
                 ("ring set up", 7, 8), ("Q to registers", 8, 4), ("listed keys", 4, 5), ("tree", 5, 6),
                 ("partial state", 6, 2))


def summary(trace: torch.Tensor, kernel_us: float, phases=PHASES) -> list[str]:
    """What the points say: the CTAs' start spread, and per phase the median and the longest."""
    rows = [r for r in trace.view(-1, STRIDE).cpu().tolist() if r[0]]
    with_item, without = [r for r in rows if r[2]], [r for r in rows if r[3]]
    t0 = min(r[0] for r in rows)

    def spread(values) -> str:
        return f"median {statistics.median(values):.2f}, max {max(values):.2f}" if values else "-"

    lines = [f"CTAs: {len(rows)} ({len(with_item)} with an item, {len(without)} without); kernel {kernel_us:.1f} us",
             f"start, us after the first CTA's: {spread([(r[0] - t0) / 1e3 for r in rows])}; of CTAs with an "
             f"item: {spread([(r[0] - t0) / 1e3 for r in with_item])}",
             f"schedule (start -> item), cycles: {spread([r[POINTS + 1] - r[POINTS] for r in with_item])}; CTAs "
             f"without an item (start -> exit): {spread([r[POINTS + 3] - r[POINTS] for r in without])}",
             f"attend (item -> attended), us: {spread([(r[2] - r[1]) / 1e3 for r in with_item])}"]
    for name, a, b in phases:  # the points a loop design does not have are 0
        values = [(r[b] - r[a]) / 1e3 for r in with_item if r[a] and r[b]]
        if values:
            lines.append(f"  {name}, us: {spread(values)}")
    lines.append(f"last CTA done, us after the first start: {max((max(r[2], r[3]) - t0) / 1e3 for r in rows):.2f}")
    ghz = [(r[POINTS + 2] - r[POINTS + 1]) / (r[2] - r[1]) for r in with_item if r[2] > r[1]]
    if ghz:  # cycles per ns between a CTA's item and its end: what converts the cycle counts
        lines.append(f"SM clock, GHz (clock64 over globaltimer, item -> attended): {spread(ghz)}")
    timeline = [r for r in with_item if r[2 * POINTS] and not r[2 * POINTS + 15] and r[4]]  # mma.sync CTAs
    if timeline:
        def after_q(slot: int) -> str:
            values = [(r[2 * POINTS + slot] - r[4]) / 1e3 for r in timeline if r[2 * POINTS + slot]]
            return f"{statistics.median(values):.2f}" if values else "-"
        lines.append("tile timeline, us after Q is in registers (median over CTAs), tile 0.."
                     f"{TIMELINE - 1}: copies issued " + " ".join(after_q(TIMELINE + i) for i in range(TIMELINE))
                     + "; thread 0 has it " + " ".join(after_q(i) for i in range(TIMELINE)))
    waits = [r[2 * POINTS:] for r in with_item if r[2 * POINTS + 15]]  # CTAs that ran seesaw pairs
    if waits:
        lines.append(f"seesaw pairs a CTA: median {statistics.median(w[15] for w in waits):.0f}")
        for consumer, steps in enumerate((PAIR_STEPS_0, PAIR_STEPS_1)):
            cycles = [f"{step} {statistics.median(w[8 * consumer + i] / w[15] for w in waits):.0f}"
                      for i, step in enumerate(steps) if step]
            lines.append(f"  consumer {consumer}, cycles a pair (median over CTAs): " + ", ".join(cycles))
        lines.append("  epilogue's row-sum exchange, cycles (median over CTAs), consumer 0 / 1: "
                     f"{statistics.median(w[7] for w in waits):.0f} / {statistics.median(w[14] for w in waits):.0f}")
    return lines


def traced_call(mod, spec, args, b: int, t: int, l: int):
    """The call to trace (run once before, to load the cubins and write a dense step's schedule
    table), the trace its CTAs write, its phases, and a line naming it."""
    if spec.model.sparse:
        x = make_sparse_inputs(spec, [t] * b, [l] * b, spec.model.index_topk, shared=args.shared, window=256,
                               device="cuda")
        lists = torch.full_like(x.topk_indices, -1) if args.empty_lists else x.topk_indices
        size = mod.sparse_workspace_bytes(x.base.q.shape[0], b)
        trace, workspace = traced_workspace(size)
        step = mod.prepare_sparse(x.base.qo_indptr, lists, x.base.op_mask, workspace=workspace)
        what = "lists of -1 only" if args.empty_lists else f"union rows per request {x.union_sizes()}"
        return lambda: step.verify(x.base.q, x.base.kv_cache, x.base.stored_k_tree, **x.base.kv_kwargs), \
            trace, SPARSE_PHASES, what
    x = make_verify_inputs(spec, [t] * b, [l] * b, device="cuda")
    tree = None if t == 1 else x.op_mask
    trace, workspace = traced_workspace(mod.workspace_bytes(x.q.shape[0], b))
    step = Step(mod._ctx, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, tree, x.q.shape[0], workspace,
                schedule_table=not args.no_table)
    call = (lambda: step.prefix(x.q, x.kv_cache, **x.kv_kwargs)) if t == 1 else \
        (lambda: step.verify(x.q, x.kv_cache, x.stored_k_tree, **x.kv_kwargs))
    return call, trace, PHASES, "without a schedule table" if args.no_table else "with a schedule table"


def traced_workspace(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The trace (int64 words) and a workspace of `size` bytes just past it: KGEN_TRACE writes
    before part_o, which starts the workspace."""
    traced = torch.zeros(TRACE_BYTES + size, dtype=torch.uint8, device="cuda")
    return traced[:TRACE_BYTES].view(torch.int64), traced[TRACE_BYTES:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="specs/glm5_sm120.yaml", help="a sparse spec traces the sparse verify")
    ap.add_argument("--shape", default="1,16,64", help="B,T,L (dense T = 1: a prefix call, else verify)")
    ap.add_argument("--tiles", default=None, help="a tiling instead of the plan's (e.g. seesaw:32,4,1)")
    ap.add_argument("--no-table", action="store_true", help="a step without schedule tables (as one-shot ops run)")
    ap.add_argument("--shared", type=float, default=0.7, help="sparse: the share of K every token of a request lists")
    ap.add_argument("--empty-lists", action="store_true", help="sparse: lists of -1 only (the fixed costs)")
    args = ap.parse_args()
    render.headers = traced_headers()
    spec = kgen.load_spec(args.spec)
    b, t, l = (int(x) for x in args.shape.split(","))
    mod = kgen.jit(spec, tiles=designs.parse(args.tiles) if args.tiles else None)
    call, trace, phases, what = traced_call(mod, spec, args, b, t, l)
    call()  # loads the cubins (and writes a dense step's schedule table)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    trace.zero_()
    begin.record()
    call()
    end.record()
    torch.cuda.synchronize()
    print(f"{args.spec} {args.shape} {args.tiles or 'plan'}, {what}")
    print("\n".join(summary(trace, begin.elapsed_time(end) * 1e3, phases)))


if __name__ == "__main__":
    main()
