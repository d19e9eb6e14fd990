"""The benchmark's CPU-checkable parts: grid, derived specs, SGLang's verify layout, CLI, plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kgen
from bench import run as bench_run
from bench.baseline import custom_mask, token_slots
from kgen import reference
from kgen.cli import app
from kgen.inputs import make_verify_inputs

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"


@pytest.fixture
def glm5():
    return kgen.load_spec(SPEC_DIR / "glm5_sm120.yaml")


def test_grid_and_derived_specs(glm5):
    shapes = bench_run.grid(glm5, quick=False, page_size=1, heads=bench_run.HEADS, trees=bench_run.TREES,
                            contexts=bench_run.CONTEXTS, batches=bench_run.BATCHES, decode=True)
    assert len(shapes) == 2 * 3 * 3 * 3 + 2 * 3 * 3  # verify grid + decode rows
    assert bench_run.spec_for(glm5, 8, 64, 1) is glm5  # the spec itself wherever it fits
    big = bench_run.spec_for(glm5, 16, 256, 64)
    assert (big.model.num_q_heads, big.tree.nodes, big.cache.page_size) == (16, 256, 64)
    assert big.model.softmax_scale == glm5.model.softmax_scale
    quick = bench_run.grid(glm5, quick=True, page_size=1, heads=(), trees=(), contexts=(), batches=(), decode=True)
    assert {s.H for s in quick} == {8} and any(s.decode for s in quick)


def test_floor_work_matches_design(glm5):
    kv, flops = bench_run.work(bench_run.Shape(8, 16, 131072, 1, 1), glm5)
    assert kv == (131072 + 16) * 1152
    assert flops == 2 * 16 * 8 * (131072 + 16) * (576 + 512)
    kv, flops = bench_run.work(bench_run.Shape(8, 1, 4096, 2, 1), glm5)  # decode: prefix only
    assert (kv, flops) == (2 * 4096 * 1152, 2 * 2 * 8 * 4096 * 1088)


@pytest.mark.parametrize("page", [1, 16])
def test_sglang_verify_layout_means_the_same_attention(glm5, page, seed):
    """Attention computed from what TritonVerify passes (token-level slots, flat [T, L + T]
    masks) equals kgen's reference verify attention."""
    g = torch.Generator().manual_seed(seed)
    x = make_verify_inputs(glm5, [5, 16, 0, 3], [100, 0, 7, 130], page_size=page, generator=g)
    qo, lens = x.qo_indptr.tolist(), x.kv_lens.tolist()
    flat, mask_indptr = custom_mask(x.tree_mask, qo, lens)
    slots = token_slots(x.kv_indptr, x.kv_indices, x.kv_lens, page)
    assert slots.dtype == torch.int64 and slots.numel() == sum(lens)
    ref_o, ref_lse = x.verify_ref()
    kv_start = 0
    for b in range(len(lens)):
        s, e, length = qo[b], qo[b + 1], lens[b]
        mask = flat[mask_indptr[b]:mask_indptr[b + 1]].view(e - s, length + e - s)
        keys = torch.cat([x.kv_cache[slots[kv_start:kv_start + length]], x.k_tree[s:e]])
        o, lse = reference.attend(x.q[s:e], keys, mask, x.scale, x.value_dim)
        torch.testing.assert_close(o, ref_o[s:e])
        torch.testing.assert_close(lse, ref_lse[s:e])
        kv_start += length


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error path")
def test_kgen_bench_without_gpu_is_one_line():
    result = CliRunner().invoke(app, ["bench", str(SPEC_DIR / "glm5_sm120.yaml"), "--quick"])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output and "Traceback" not in result.output


def test_bench_tiles_that_are_no_tiling_are_an_error_before_the_gpu_is_looked_for():
    from bench.run import BenchError, run

    with pytest.raises(BenchError, match=r"--tiles 'seesaw:32,x' is not a tiling \(seesaw:BN,STAGES,MIN_BLOCKS or wgmma:"):
        run(SPEC_DIR / "glm5_sm120.yaml", quick=True, tiles="seesaw:32,x")


def _result(rows_per_head: int, triton: bool, peers: tuple[str, ...]) -> dict:
    """A results file as bench/run.py writes it: kgen times, and Triton's / the peers' where asked."""
    rows = []
    for i in range(rows_per_head):
        for h in (8, 16):
            t, length, b = (1, 16, 64)[i % 3], 4096 << (i % 6), 1 + i % 32
            us = 10.0 + i
            rows.append(dict(H=h, T=t, L=length, B=b, page_size=64, mode="decode" if t == 1 else "verify", us=us,
                             pct_floor=50.0 + i, pct_floor_gemm=40.0 + i, us_triton=100 * us if triton and t > 1 else None,
                             **{f"us_{p}": us * (0.5 + i % 3 / 2) if p in peers else None
                                for p in ("flashinfer_fa3", "flashinfer_fa2", "flashmla")}))
    return {"spec": "glm5_sm120", "device": "NVIDIA H200", "plan_arch": None, "rows": rows,
            "ceilings": {"copy_tbps": 4.27, "mma_tflops": 645.0, "gemm_tflops": 775.0}}


@pytest.mark.parametrize("rows_per_head, triton, peers", [(2, True, ()), (2, False, ()), (6, True, ("flashinfer_fa3", "flashmla")),
                                                       (6, False, ("flashinfer_fa2",)), (36, True, ("flashinfer_fa3",))])
def test_plot_reads_whole_with_no_empty_panel(tmp_path, rows_per_head, triton, peers):
    """The figure's artists, not its pixels: the title lies inside the figure, every axes has bars
    (no panel for what was not measured: no Triton, no peers), one legend entry per peer measured,
    tick labels neither overlap nor leave the figure; the full grid is split over rows of panels."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from bench.plot import SHAPES_PER_AXES, figure, plot

    result = _result(rows_per_head, triton, peers)
    fig = figure(result)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox

    def inside(box):
        return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1

    assert inside(fig._suptitle.get_window_extent(renderer)), "the title is cut by an edge of the figure"
    chunks = -(-len(result["rows"]) // SHAPES_PER_AXES)
    assert len(fig.axes) == chunks * (2 if triton or peers else 1)
    labels = {"flashinfer_fa3": "FlashInfer fa3", "flashinfer_fa2": "FlashInfer fa2", "flashmla": "FlashMLA"}
    for ax in fig.axes:
        assert [p for p in ax.patches if p.get_height() > 0], f"empty panel: {ax.get_title()}"
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        if "speedup" in ax.get_title():
            assert legend == ["SGLang Triton"] * triton + [labels[p] for p in peers]
        else:
            assert legend == ["% of floor (mma.sync)", "% of GEMM floor"]
        ticks = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
        assert len(ticks) <= SHAPES_PER_AXES and all(inside(b) for b in ticks)
        assert all(a.x1 <= b.x0 for a, b in zip(ticks, ticks[1:])), f"tick labels overlap in {ax.get_title()}"
    plt.close(fig)
    path = plot(result, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(result)  # rows are plain JSON


def test_plot_of_a_run_that_measured_nothing_has_no_axes():
    pytest.importorskip("matplotlib")
    from bench.plot import figure

    fig = figure({"spec": "glm5_sm120", "device": "test", "ceilings": {}, "rows": []})
    assert fig.axes == [] and any("no shape was measured" in t.get_text() for t in fig.texts)


def test_cvt_peak_compiles_to_the_fp8_unpack_of_the_attention_loops():
    from bench.ceilings import CVT_SOURCE
    from kgen import nvrtc, sass

    for arch in ("sm_90", "sm_120"):
        cubin = nvrtc.compile_cubin(CVT_SOURCE.read_text(), {}, arch, "cvt_peak", CVT_SOURCE.name).cubin
        assert any(op.startswith("F2FP.F16.E4M3.UNPACK_B") for op in sass.opcodes(sass.disassemble(cubin)))


def test_gather_probe_moves_rows_by_bulk_copies_or_loads_and_cuts_each_designs_rows():
    """bench.gather_probe: modes 0 and 1 stage rows by bulk copies, mode 2 by 16-byte loads, none
    spills; a B = 1 T16 request's rows per design are its entries (gather), each 2-token tile's
    distinct slots (union16), each 8-token tile's (union64) or the request's (union128), cut in split order."""
    import torch

    from bench.gather_probe import HEADER, SOURCE, packed, row_sets
    from kgen import nvrtc, sass
    from kgen.sparse_testing import indexer_lists

    for mode, op in ((0, "UBLKCP"), (1, "UBLKCP"), (2, "LDG.E.128")):
        c = nvrtc.compile_cubin(SOURCE.read_text(), {"kgen/common.cuh": HEADER.read_text()}, "sm_90",
                                "gather_probe", SOURCE.name, [f"-DMODE={mode}"])
        assert c.report.spill_stores == 0
        assert any(o.startswith(op) for o in sass.opcodes(sass.disassemble(c.cubin))), (mode, op)
    lists = indexer_lists(torch.arange(8192), 16, 2048, shared=0.7, window=256, generator=torch.Generator().manual_seed(0))
    sets = row_sets([lists])
    assert [p.numel() for p in sets["gather16"]] == [128] * 256
    assert torch.equal(sets["gather16"][33], lists[2:4].reshape(-1)[128:256])
    tile0 = torch.cat(sets["union16"][:32])
    assert torch.equal(tile0, torch.unique(lists[:2]))
    assert torch.equal(torch.cat(sets["union128"]), torch.unique(lists)) and len(sets["union128"]) == 256
    assert torch.equal(torch.cat(sets["union64"][128:]), torch.unique(lists[8:]))
    sizes = [torch.cat(sets[d]).numel() for d in ("union128", "union64", "union16", "gather16")]
    assert sizes == sorted(sizes) and sizes[-1] == 16 * 2048
    slots, begin = packed(sets["gather_t1"])
    assert begin.tolist() == list(range(0, 2049, 64)) and torch.equal(slots, lists[0].int())
    assert packed(sets["empty"])[1].tolist() == [0] * 257
    batched = row_sets([lists, lists + 8192] * 16)  # B32: 256 two-token tiles, one split each
    assert len(batched["gather16"]) == 256 and "gather_t1" not in batched
    assert [len(batched[d]) for d in ("union64", "union128")] == [256, 256]  # 64 and 32 tiles: 4 and 8 splits


def test_model_validate_reads_ncu_csv():
    from bench.model_validate import parse_ncu_csv

    text = ('==PROF== Connected to process 1\n"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","verify_attn__x","dram__bytes_read.sum","byte","1,234,567"\n'
            '"0","verify_attn__x","lts__t_sector_hit_rate.pct","%","78.5"\n')
    assert parse_ncu_csv(text) == {"dram__bytes_read.sum": 1234567.0, "lts__t_sector_hit_rate.pct": 78.5}
    assert parse_ncu_csv("==ERROR== no kernels were profiled\n") == {}


def test_warm_plans_what_the_gpu_tests_load():
    """bench.warm's groups name the plans the GPU tests jit: the DSA group's specs are the ones the
    backend derives (their names), the sm_90 loops group runs the wgmma loop over fp8 rows, the
    seesaw loop, and the mma.sync loop over the DSA rows with their scales in V or at 16-row tiles."""
    from bench import warm
    from kgen.plan import plan

    dsa = warm.jobs("dsa")
    assert [s.name for s, _, _ in dsa] == ["sglang_dsa_h8_k2048_bf16_n4", "sglang_dsa_h8_k2048_bf16_n16",
                                           "sglang_dsa_h8_k2048_fp8_n16"]
    assert dsa[2][0].cache.per_block and dsa[2][0].model.index_topk == 2048
    for spec, arch, tiles in warm.jobs("sm90_loops"):
        p = plan(spec, arch, tiles)
        assert p.tiles.design == "seesaw" or (p.tiles.design == "wgmma" and spec.cache.kv_dtype == "float8_e4m3fn") \
            or (p.tiles.design == "mma_sync" and (p.tiles.v_scaled(spec) or p.tiles.bm == 16))
    assert {s.name for s, _, _ in warm.jobs("sparse")} >= {"glm5_dsa_sm120", "glm5_dsa_bf16_sm120"}
    from test_dsa_pool_gpu import SPECS

    pool = warm.jobs("dsa_pool")
    assert {(s.name, arch) for s, arch, _ in pool} == {(n, a) for n in SPECS for a in ("sm_90", "sm_120")}
    assert all(s.cache.per_block for s, _, _ in pool)


def test_cta_trace_points_compile_into_the_attention_kernels_and_leave_the_checkout_alone(tmp_path, monkeypatch):
    """bench/cta_trace.py patches copies of the attention headers: its anchors must still be there,
    and the traced verify kernels must compile (NVRTC, sm_90) with their points' timer and clock reads:
    5 in the seesaw loop (the sm_90 plan), 9 in the mma.sync loop (the sm_120 plan), 16 in the sparse
    verify kernel of both plans (on the mma.sync loop, with the schedule's, Q's copies and the key list's),
    and the mma.sync loop's tile timeline (a timer read where thread 0 has each tile, and where the producer
    has issued one: 8 sites as ptxas inlines them)."""
    from bench import cta_trace
    from kgen import render, sass
    from kgen.build import build_variant
    from kgen.cache import KernelCache
    from kgen.plan import plan

    plain = render.headers()
    traced = cta_trace.traced_headers()()
    assert sum(traced[name].count("KGEN_TRACE(") for name in cta_trace.PATCHES) == 20
    assert sum(traced[name].count("KGEN_TRACE_AT(") for name in cta_trace.PATCHES) == 4
    assert sum(traced[name].count("KGEN_TRACE_TILE(") for name in cta_trace.PATCHES) == 2
    assert not any("KGEN_TRACE" in text for text in plain.values())
    assert render.headers() == plain  # the checkout's headers are untouched
    monkeypatch.setattr(render, "headers", cta_trace.traced_headers())
    spec = kgen.load_spec(Path(__file__).parent.parent / "specs" / "glm5_sm120.yaml")
    sparse = kgen.load_spec(Path(__file__).parent.parent / "specs" / "glm5_dsa_sm120.yaml")
    # (the seesaw loop's: its consumer points once per consumer role, and the ring's set-up)
    for spec, kernel, arch, points, timeline in ((spec, "verify_attn", "sm_90", 14, 0),
                                                 (spec, "verify_attn", "sm_120", 9, 8),
                                                 (sparse, "sparse_verify_attn", "sm_90", 16, 8),
                                                 (sparse, "sparse_verify_attn", "sm_120", 16, 8)):
        disasm = sass.dump(build_variant(plan(spec, arch).variant(kernel), "sm_90", KernelCache(tmp_path)).cubin)
        assert disasm.count("GLOBALTIMER") == points + timeline and disasm.count("SR_CLOCK") >= points, (kernel, arch)


def test_cta_trace_summary_reads_each_ctas_points():
    from bench.cta_trace import STRIDE, summary

    ns = 1000  # the global timer counts ns; clocks are cycles
    z = [0] * 12  # points 4-15, which these rows do not have
    rows = [[100 * ns, 103 * ns, 110 * ns, 0, *z, 5000, 8000, 21000, 0, *z],   # an item: schedule 3000 cycles
            [101 * ns, 105 * ns, 112 * ns, 0, *z, 7000, 11000, 25000, 0, *z],  # an item: 4000 cycles, done at +12 us
            [102 * ns, 0, 0, 104 * ns, *z, 6000, 0, 0, 9500, *z],             # no item: exits after 3500 cycles
            [0] * 32]                                                          # a slot no CTA wrote
    rows = [r + [0] * (STRIDE - 32) for r in rows]  # no seesaw accumulators
    lines = summary(torch.tensor(rows, dtype=torch.int64).flatten(), 15.0)
    assert lines[0] == "CTAs: 3 (2 with an item, 1 without); kernel 15.0 us"
    assert lines[1] == "start, us after the first CTA's: median 1.00, max 2.00; of CTAs with an item: median 0.50, max 1.00"
    assert lines[2].startswith("schedule (start -> item), cycles: median 3500.00, max 4000.00")
    assert lines[2].endswith("(start -> exit): median 3500.00, max 3500.00")
    assert lines[3] == "attend (item -> attended), us: median 7.00, max 7.00"
    assert lines[4] == "last CTA done, us after the first start: 12.00"
    # clock64 over the global timer from item to attended: 13000 and 14000 cycles in 7 us
    assert lines[5] == "SM clock, GHz (clock64 over globaltimer, item -> attended): median 1.93, max 2.00"


def test_cta_trace_summary_reads_the_seesaw_pairs_accumulators():
    from bench.cta_trace import POINTS, STRIDE, summary

    us = 1000
    row = [0] * STRIDE
    row[0], row[1], row[2] = 1 * us, 2 * us, 30 * us  # start, item, attended
    waits = row[2 * POINTS:]
    waits[:7] = [3000, 400, 200, 100, 800, 600, 52000]  # consumer 0's, summed over 10 pairs; the last the whole pairs
    waits[8:14] = [3100, 900, 50, 300, 500, 51000]  # consumer 1's
    waits[7], waits[14] = 1500, 40  # the epilogue's exchange: once a CTA, not a pair
    waits[15] = 10
    row[2 * POINTS:] = waits
    lines = summary(torch.tensor([row], dtype=torch.int64).flatten(), 31.0)
    assert lines[-1] == "  epilogue's row-sum exchange, cycles (median over CTAs), consumer 0 / 1: 1500 / 40"
    assert lines[-4:-1] == ["seesaw pairs a CTA: median 10",
                          "  consumer 0, cycles a pair (median over CTAs): Q.K a (with its ring wait) 300, MAX1 barrier "
                          "40, O free (P.V a done) 20, ring wait b 10, P1 barrier 80, P.V b 60, whole pair 5200",
                          "  consumer 1, cycles a pair (median over CTAs): Q.K b (with its ring wait) 310, MAX0 barrier "
                          "90, ring wait a 5, P0 barrier 30, P.V waits 50, whole pair 5100"]


def test_cta_trace_summary_splits_the_sparse_verifys_phases():
    from bench.cta_trace import SPARSE_PHASES, summary

    us = 1000  # global timer ns per us
    #      0 start, 1 item, 2 attended, 3 -, 4 Q, 5 listed keys, 6 tree, 7 list built, 8 ring set up,
    #      9 schedule's sums, 10 set cleared, 11 entries scanned, 12 list written, 13 -, 14 Q's copies
    #      issued, 15 the union's round started; then the 16 clocks
    row = [1 * us, 2 * us, 30 * us, 0, 14 * us, 24 * us, 26 * us, 12 * us, 13 * us, 1500, 3 * us, 9 * us, 11 * us,
           0, 2250, 2500]
    row = row + [1] * 16 + [0] * 16  # no seesaw accumulators
    lines = summary(torch.tensor([row], dtype=torch.int64).flatten(), 31.0, SPARSE_PHASES)
    assert lines[4:18] == ["  schedule: sums, chunk, us: median 0.50, max 0.50",
                           "  schedule: scan to the item, us: median 0.50, max 0.50",
                           "  Q's copies issued, us: median 0.25, max 0.25",
                           "  key list: to build_union, us: median 0.25, max 0.25",
                           "  key list: set cleared, us: median 0.50, max 0.50",
                           "  key list: entries scanned, us: median 6.00, max 6.00",
                           "  key list: list written, us: median 2.00, max 2.00",
                           "  key list: to its end, us: median 1.00, max 1.00",
                           "  key list (all), us: median 10.00, max 10.00",
                           "  ring set up, us: median 1.00, max 1.00",
                           "  Q to registers, us: median 1.00, max 1.00",
                           "  listed keys, us: median 10.00, max 10.00",
                           "  tree, us: median 2.00, max 2.00",
                           "  partial state, us: median 4.00, max 4.00"]


def test_cta_trace_summary_splits_the_phases_of_the_mma_sync_loop():
    from bench.cta_trace import summary

    us = 1000  # global timer ns per us
    #      0 start, 1 item, 2 attended, 3 -, 4 Q, 5 prefix, 6 tree, 7 chunk (8-15 none); then the 16 clocks
    row = [1 * us, 4 * us, 20 * us, 0, 6 * us, 15 * us, 17 * us, 3 * us] + [0] * 8 + [1] * 16 + [0] * 16
    lines = summary(torch.tensor([row], dtype=torch.int64).flatten(), 25.0)
    assert lines[4:10] == ["  schedule: lengths, sums, chunk, us: median 2.00, max 2.00",
                           "  schedule: scan to the item, us: median 1.00, max 1.00",
                           "  Q to registers, us: median 2.00, max 2.00",
                           "  first range (prefix), us: median 9.00, max 9.00",
                           "  second range (tree), us: median 2.00, max 2.00",
                           "  partial state, us: median 3.00, max 3.00"]


def test_model_validate_times_prepared_steps_as_bench_run_does():
    """The model is fitted on what a server calls: a step prepared once per input set (outside the
    timed replays; the sets' steps in the workspace given), then its verify (tree keys as the cache
    stores them) or, for decode, its prefix."""
    from types import SimpleNamespace

    from bench.model_validate import one_call

    made, ran = [], []

    class Step:
        def verify(self, *args, **kw):
            ran.append(("verify", args, kw))

        def prefix(self, *args, **kw):
            ran.append(("prefix", args, kw))

    mod = SimpleNamespace(prepare=lambda *args, **kw: made.append((args, kw)) or Step())
    x = SimpleNamespace(qo_indptr="qo", kv_indptr="kvp", kv_indices="kvi", kv_lens="lens", op_mask="mask",
                        q=torch.zeros(48, 1), kv_cache="cache", stored_k_tree="stored", kv_kwargs={"kv_scale": 0.5})
    verify, decode = one_call(mod, x, decode=False, workspace="shared"), one_call(mod, x, decode=True)
    assert made == [(("qo", "kvp", "kvi", "lens", "mask"), {"num_tokens": 48, "workspace": "shared"}),
                    (("qo", "kvp", "kvi", "lens", None), {"num_tokens": 48, "workspace": None})] and ran == []
    verify()
    decode()
    assert ran == [("verify", (x.q, "cache", "stored"), {"kv_scale": 0.5}),
                   ("prefix", (x.q, "cache"), {"kv_scale": 0.5})]


def test_model_validate_records_the_tiling_each_step_ran():
    """Each timed row records the tiling its prepared step ran: the shape's bucket in the spec's tuned
    table (its prefix capacity counted in whole pages, as a step counts kv_indices), else the plan
    fitted to the batch."""
    from bench.model_validate import SHAPES, step_tiles
    from kgen.arch import get_arch
    from kgen.choice import PlanChoice
    from kgen.model import Shape
    from kgen.tuning import Bucket

    spec = kgen.load_spec(Path(__file__).resolve().parents[1] / "specs" / "glm5_p64_sm120.yaml")
    choice = PlanChoice.find(spec, get_arch("sm_90"), cubin_arch=get_arch("sm_90"))
    assert choice.table is not None
    h, t, length, b = SHAPES["memory_b32_long"]
    assert step_tiles(choice, spec, SHAPES["memory_b32_long"]) == choice.table.tiles_for(Bucket.of(t * b, b, length * b))
    assert Shape(8, 1, 100, 2, 64).context_tokens == 256  # two requests' two pages of 64 slots


def test_union_work_counts_units_and_ring_rows_per_kernel():
    """bench.union_work on lists small enough to count by hand: 32-key tiles, 2 tokens a row block."""
    from bench.union_work import count

    a, b, c = set(range(32)), set(range(100, 132)), set(range(200, 232))
    assert count([a | b, a | c]) == {"union": (3, 96), "gather": (4, 128), "request union": (3, 96)}
    # two row blocks sharing a: each block's union reads a again; the request's reads it once
    assert count([a | b, a | b, a | c, a | c]) == {"union": (4, 128), "gather": (8, 256), "request union": (4, 96)}


def test_bench_sparse_takes_shapes_of_its_own():
    import argparse

    from bench.sparse import parse_shape

    assert parse_shape("1,131072,32,0.5") == (1, 131072, 32, 0.5)
    for bad in ("1,131072,32", "1,131072,x,0.5", "0,4096,16,0.7", "1,4096,16,1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="B,L,T,SHARED|at least 1"):
            parse_shape(bad)


def test_bench_sparse_refuses_shapes_of_both_kinds(capsys):
    from bench.sparse import main

    with pytest.raises(SystemExit) as e:
        main(["--shapes", "0", "--shape", "1,4096,16,0.7"])
    assert e.value.code == 2 and "--shape and --shapes: give one or the other" in capsys.readouterr().err


def _sass_csv(path: Path, rows: list[tuple[str, int, int, int]]) -> None:
    """ncu's SASS source page as CSV: the kernel row, the header, then (source, samples, long_sb, wait)."""
    import csv
    import gzip

    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "sparse_verify_attn__x", ""])
        w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_wait",
                    "stall_long_sb (Not Issued)"])
        for i, (source, samples, long_sb, wait) in enumerate(rows):
            w.writerow([hex(0x100 + 16 * i), source, samples, long_sb, wait, 99])


def test_sass_samples_names_the_line_the_warps_wait_on(tmp_path):
    """bench.sass_samples reads ncu's CSV (gzipped), ranks lines by the chosen stall, leaves out the
    "(Not Issued)" columns, strips predicates and modifiers from opcodes, and sums runs of lines."""
    from bench import sass_samples

    csv_path = tmp_path / "sass.csv.gz"
    _sass_csv(csv_path, [("@!P0 LDG.E R66, desc[UR10][R66.64]", 10, 0, 8),
                         ("@!P0 SHF.R.U32.HI R70, RZ, R75, R66", 300, 290, 5),
                         ("HMMA.16816.F32 R88, R68, R62, R88", 40, 0, 30),
                         ("FADD R1, R2, R3", 50, 1, 40)])
    kernel, lines = sass_samples.read(csv_path)
    assert kernel == "sparse_verify_attn__x"
    assert [x.opcode for x in lines] == ["LDG", "SHF", "HMMA", "FADD"]
    assert set(lines[0].stalls) == {"long_sb", "wait"}
    text = sass_samples.report(kernel, lines, "long_sb", top=1, block=2)
    assert "400 samples" in text and "long_sb                   291  72.8%" in text
    ranked = text.split("lines with most 'long_sb' samples:\n")[1].splitlines()[0]
    assert ranked.split()[:3] == ["1", "290", "of"] and "SHF.R.U32.HI" in ranked
    assert "0-    1     310  77.5%  SHF:300 LDG:10" in text and "2-    3      90  22.5%  FADD:50 HMMA:40" in text
    bad = tmp_path / "other.csv"
    bad.write_text("a,b\nc,d\n")
    with pytest.raises(ValueError, match="not ncu's SASS source page"):
        sass_samples.read(bad)


def test_union_build_probe_compiles_kgens_builder_and_cuts_requests_into_tiles():
    """bench.union_build_probe: every design compiles kgen's build_union (templates/sparse_attention.cuh)
    without spills and asks for shared memory an H100 gives a CTA, split designs two CTAs an SM; a
    request's row tiles start at its tokens and a last tile keeps its remainder; a tile's expected list
    length is its distinct listed slots."""
    import torch

    from bench.gather_probe import SMEM_FOR_CTAS
    from bench.union_build_probe import DESIGNS, SOURCE, expected_lengths, headers, tiles_of
    from kgen import nvrtc

    for name, d in DESIGNS.items():
        c = nvrtc.compile_cubin(SOURCE.read_text(), headers(), "sm_90", "union_build_probe", SOURCE.name, d.options())
        assert c.report.spill_stores == 0, name
        assert d.smem() <= 227 * 1024 and (d.whole or d.smem() == SMEM_FOR_CTAS[2]), name
    first, count = tiles_of(2, 12, 8, "cpu")
    assert first.tolist() == [0, 8, 12, 20] and count.tolist() == [8, 4, 8, 4]
    topk = torch.tensor([[5, 7, -1], [7, 9, 1], [3, -1, -1]], dtype=torch.int32)
    assert expected_lengths(topk, torch.tensor([0, 2]), torch.tensor([2, 1])) == [4, 1]
