"""The resource model (kgen/model.py) and the occupancy calculator, on the CPU (NVRTC + nvdisasm)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgen import model
from kgen.arch import get_arch
from kgen.cli import app
from kgen.model import Calibration, Item, Shape, floor, grid, predict, rank_by_model, simulate
from kgen.occupancy import occupancy
from kgen.designs import MmaSyncTiles, OverlapTiles, SeesawTiles, WgmmaTiles, base
from kgen.plan import plan
from kgen.spec import load_spec
from kgen.tuning import Bucket

ROOT = Path(__file__).resolve().parents[1]
SPEC_DIR = ROOT / "specs"
MAIN = Shape(8, 16, 131072, 1)  # B=1, T=16, L=131072, H=8
CAL = Calibration(overlap=0.0, barrier_cycles=0.0, dram_efficiency=0.75, latency_us=0.0, startup_us=2.0,
                  item_gbps=20.0, combine_us=6.0, state_us=0.13, quantize_us=10.0)


def spec(name: str):
    return load_spec(SPEC_DIR / f"{name}.yaml")


@pytest.mark.parametrize("name, arch, mma, per_warp, unpacks, tiles", [
    ("glm5_sm120", "sm_90", "HMMA.16816.F32.BF16", 68, 0, None),  # QK 9 k-steps x 4 n-tiles + PV 2 x 16
    ("glm5_sm120", "sm_120", "HMMA.16816.F32.BF16", 68, 0, None),
    ("glm5_fp8_sm120", "sm_120", "HMMA.16816.F32", 68, 136, None),  # f16: K 9 x 8 + V 8 x 8 conversions
    ("glm5_fp8_mma_e4m3_sm120", "sm_120", "QMMA.16832.F32.E4M3.E4M3", 36, 0, None),  # QK 5 x 4 + PV 16 (busiest group)
    # the overlap loop, 16-key tiles: QK 9 k-steps x 2 row tiles x 1 key tile + PV 2 x 8; 32-key tiles twice that
    ("glm5_sm120", "sm_120", "HMMA.16816.F32.BF16", 34, 0, OverlapTiles(16, 4, 1)),
    ("glm5_sm120", "sm_90", "HMMA.16816.F32.BF16", 34, 0, OverlapTiles(16, 4, 0)),
    ("glm5_sm120", "sm_120", "HMMA.16816.F32.BF16", 68, 0, OverlapTiles(32, 2, 0)),
])
def test_tile_loop_is_one_tile_of_the_plan(name, arch, mma, per_warp, unpacks, tiles):
    loop = model._loop(plan(spec(name), "sm_120", tiles).variant("prefix_attn"), arch)
    assert loop[mma] == per_warp and sum(n for op, n in loop.items() if "MMA" in op) == per_warp
    assert sum(n for op, n in loop.items() if op.startswith("F2FP") and "UNPACK" in op) == unpacks
    assert sum(n for op, n in loop.items() if op.startswith("BAR.SYNC")) == 2  # the tile's two barriers


def test_shared_wavefronts_of_the_bf16_tile_match_the_v7_count():
    """bench/NOTES.md (ncu of the v12 loop): ~1450 wavefronts of K/V/P fragments and partial
    scores per 32-key tile, plus 36.9 KB of bulk-copy writes."""
    work = model.tile_work(plan(spec("glm5_sm120")), get_arch("sm_90"))
    lsu = work.smem_wavefronts - work.kv_bytes / 128
    assert work.kv_bytes == 32 * 1152 and 1400 <= lsu <= 1550
    assert work.mma_flops == {"bf16": 8 * 68 * 4096}
    cycles = model.pipe_cycles(work, get_arch("sm_120"))
    assert cycles["tensor"] == pytest.approx(8 * 68 * 4096 / 1024, rel=0.01)  # ~1024 FLOP/cycle/SM on sm_120
    assert cycles["tensor"] > cycles["smem"]  # MMA-bound there, shared-memory-bound on the H200:
    h200 = model.pipe_cycles(work, get_arch("sm_90"))
    assert h200["smem"] > 2 * h200["tensor"]


def test_the_overlap_loop_reads_each_k_and_v_fragment_once():
    """Every warp on all 32 rows: K (36 KB per 32 keys) and V (32 KB) fragments are read once per
    CTA, P by every warp, partial scores 4 x 4 KB written and read: 25-30% fewer shared wavefronts
    per key than the row-block loop (1016-1088 against 1448 per 32 keys), the same MMA FLOPs."""
    rows = model.tile_work(plan(spec("glm5_sm120")), get_arch("sm_120"))
    for tiles in (OverlapTiles(16, 4, 1), OverlapTiles(32, 2, 0)):
        work = model.tile_work(plan(spec("glm5_sm120"), tiles=tiles), get_arch("sm_120"))
        per_key = (work.smem_wavefronts - work.kv_bytes / 128) / work.keys
        assert work.mma_flops == {"bf16": 8 * 68 * 4096 * tiles.bn // 32}
        assert 900 / 32 <= per_key <= 0.76 * (rows.smem_wavefronts - rows.kv_bytes / 128) / rows.keys


def test_the_wgmma_loop_counts_warpgroup_mmas_and_their_shared_operands():
    """Per 64 x 32 tile: 2 consumers x (18 m64n32k16 + 2 m64n256k16) = the tile's 2*64*32*1088 FLOPs at
    the wgmma rate; the wgmmas read K (36 KB), V (32 KB) and Q's smem-resident dims (24 KB) themselves."""
    work = model.tile_work(plan(spec("glm5_sm120"), "sm_90", WgmmaTiles(stages=4)), get_arch("sm_90"))
    assert work.mma_flops == {"wgmma_bf16": 2 * 64 * 32 * 1088} and work.keys == 32
    lsu = work.smem_wavefronts - work.kv_bytes / 128 - (36 + 32 + 24) * 1024 / 128
    assert 0 < lsu < 400  # the partial-score exchange, through lds/sts
    cycles = model.pipe_cycles(work, get_arch("sm_90"))
    assert cycles["tensor"] == pytest.approx(2 * 64 * 32 * 1088 / (775e12 / (132 * 1.755e9)), rel=0.01)


def test_the_seesaw_loop_counts_one_consumers_pair_loop_as_a_tile():
    """The SASS tile loop is one consumer's pair: Q·K of its tile over all 576 dims (36 m64n32k16) and
    P·V of both tiles over its 256 value dims (4 m64n256k16): once per tile, the tile's 2*64*32*1088
    FLOPs; its wgmmas read K (36 KB), Q's shared-memory dims (56 KB: the last 8 of Q's 36 k-steps are in
    registers), V (32 KB) and the other consumer's probability tile (4 KB) themselves."""
    from kgen.designs import SeesawTiles

    work = model.tile_work(plan(spec("glm5_sm120"), "sm_90", SeesawTiles(stages=4)), get_arch("sm_90"))
    assert work.mma_flops == {"wgmma_bf16": 2 * 64 * 32 * 1088} and work.keys == 32
    lsu = work.smem_wavefronts - work.kv_bytes / 128 - (36 + 56 + 32 + 4) * 1024 / 128
    assert 0 < lsu < 400  # the probabilities and per-row values passed through sts/lds
    wgmma = model.tile_work(plan(spec("glm5_sm120"), "sm_90", WgmmaTiles(stages=4)), get_arch("sm_90"))
    assert work.issue < wgmma.issue  # one warpgroup's instructions a tile, not two


def test_the_wgmma_loop_over_fp8_rows_adds_the_producers_conversion_once():
    """The producer reads each raw tile back (BN rows of e4m3 bytes) and writes it to the ring in
    bf16, once per tile: (32 x 576 + 32 x 576 x 2) / 128 wavefronts more than the bf16 rows' tile,
    whose cp.async staging moves twice the raw bytes; one conversion lane per e4m3 element."""
    from kgen.designs import wgmma as wgmma_design

    tiles, empty = wgmma_design.WgmmaTiles(stages=3), Counter()  # no consumer instructions: the design's own terms
    bf16 = wgmma_design.DESIGN.tile_work(spec("glm5_sm120"), tiles, empty)
    fp8 = wgmma_design.DESIGN.tile_work(spec("glm5_fp8_sm120"), tiles, empty)
    raw, ring = 32 * 576, 32 * 576 * 2
    assert fp8.smem_wavefronts - bf16.smem_wavefronts == pytest.approx((raw + ring) / 128 + (raw - ring) / 128)
    assert fp8.convert_lanes == raw and bf16.convert_lanes == 0


def test_a_design_without_its_own_fit_uses_the_row_block_loops_terms(tmp_path, monkeypatch):
    data = json.loads(model.CALIBRATION_FILE.read_text())
    data["designs"] = {"overlap": {"overlap": 0.5, "barrier_cycles": 10.0}}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(model, "CALIBRATION_FILE", path)
    model.calibration.cache_clear()
    try:
        assert model.calibration("overlap").overlap == 0.5 and model.calibration("overlap").barrier_cycles == 10.0
        assert model.calibration("wgmma") == model.calibration("mma_sync")
        assert model.calibration("wgmma").dram_efficiency == data["calibration"]["dram_efficiency"]
    finally:
        model.calibration.cache_clear()


def test_the_16_row_tiles_use_their_own_terms_where_fitted(tmp_path, monkeypatch):
    """Decode's 16-row mma.sync tiles have DESIGN_TERMS of their own ("mma_sync16"); every other
    mma.sync tiling (deep rings too: the sm_120 plans' predictions must not move on sm_90's decode),
    and they too until a fit gives them some, the row-block loop's."""
    sixteen = MmaSyncTiles(16, 32, 1, 4, 1)
    assert model.terms_of(sixteen) == model.terms_of(MmaSyncTiles(16, 32, 1, 2, 1)) == "mma_sync16"
    assert model.terms_of(MmaSyncTiles(32, 32, 2, 4, 1)) == "mma_sync" and model.terms_of(SeesawTiles()) == "seesaw"
    data = json.loads(model.CALIBRATION_FILE.read_text())
    data["calibration"]["dram_efficiency"] = 0.6  # the row-block loop's, below the 16-row tiles' own
    data["designs"] = {"mma_sync16": {"overlap": 0.25, "barrier_cycles": 0.0, "dram_efficiency": 0.9}}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(model, "CALIBRATION_FILE", path)
    model.calibration.cache_clear()
    try:
        shape, s = Shape(8, 1, 131072, 32), spec("glm5_sm120")
        fast = predict(s, shape, "sm_90", plan_for="sm_90", tiles=sixteen)
        assert fast.us == predict(s, shape, "sm_90", plan_for="sm_90", tiles=sixteen,
                                  cal=model.calibration("mma_sync16")).us
        data["designs"] = {}
        path.write_text(json.dumps(data))
        model.calibration.cache_clear()
        assert model.calibration("mma_sync16") == model.calibration("mma_sync")
        assert predict(s, shape, "sm_90", plan_for="sm_90", tiles=sixteen).us > fast.us  # 0.9 of DRAM is faster
    finally:
        model.calibration.cache_clear()


def test_wavefront_and_mma_parsing():
    assert base._mma("HMMA.16816.F32.BF16") == ("bf16", 4096)
    assert base._mma("QMMA.16832.F32.E4M3.E4M3") == ("e4m3", 8192)
    assert base._mma("HGMMA.64x256x16.F32.BF16") == ("wgmma_bf16", 2 * 64 * 256 * 16)
    assert base._mma("LDSM.16.M88.4") is None
    assert [base._wavefronts(op) for op in ("LDSM.16.MT88.4", "LDSM.16.M88.2", "LDS.128", "STS.64", "STS.U16",
                                            "LDS", "FADD")] == [4, 2, 4, 2, 1, 1, 0]
    work = base.tile_work_from_loop(Counter({"HMMA.16816.F32": 2, "LDSM.16.M88.4": 1, "F2FP.F16.E4M3.UNPACK_B": 3,
                                              "BAR.SYNC.DEFER_BLOCKING": 2}), warps=8, keys=32, kv_bytes=256)
    assert work.mma_flops == {"f16": 8 * 2 * 4096} and work.smem_wavefronts == 8 * 4 + 2
    assert work.convert_lanes == 8 * 32 * 3 and work.barriers == 2 and work.issue == 2 * 8


def test_work_items_mirror_the_schedule():
    p = plan(spec("glm5_sm120"))
    items, splits = model.work_items(p, MAIN, 132)  # 4 row tiles x 4096 KV tiles over 132 CTAs
    assert len(items) == 132 and splits == 33  # chunk = ceil(16384 / 132) = 125 tiles
    assert [it.tiles for it in items[:4]] == [125] * 4 and items[-1].tiles == 4096 - 32 * 125 + 1  # + the tree tile
    assert items[0].dram_bytes == pytest.approx(32 * 1152 / 4)  # 4 row tiles share each chunk
    decode, splits = model.work_items(p, Shape(8, 1, 4096, 1), 132)
    assert (len(decode), splits) == (32, 32) and {it.tiles for it in decode} == {4}  # at least 4 tiles a split


def test_simulation_waves_and_dram_sharing():
    one = [Item(tiles=10, dram_bytes=0.0)]
    assert simulate(one * 4, 4, compute_us=1.0, dram_bytes_per_us=1.0, startup_us=2.0) == (12.0, 0.0)
    assert simulate(one * 8, 4, 1.0, 1.0, 2.0)[0] == pytest.approx(24.0)  # two waves
    heavy = [Item(tiles=10, dram_bytes=3.0)] * 2  # 6 bytes per tile round at 2 bytes/us: 3 us a tile
    span, dram = simulate(heavy, 2, 1.0, 2.0, 0.0)
    assert span == pytest.approx(30.0) and dram == pytest.approx(30.0)
    short_and_long = [Item(2, 0.0), Item(10, 0.0), Item(10, 0.0)]  # the third starts when the short one ends
    assert simulate(short_and_long, 2, 1.0, 1.0, 0.0)[0] == pytest.approx(12.0)


def test_a_work_items_startup_is_the_shared_term_and_its_own_bytes():
    """No design has a startup constant of its own: a work item pays startup_us and its Q rows in and
    its partial state's BM rows out at item_gbps, so decode's 8 rows a CTA start sooner than a
    verify's full row tiles, and 16-row tiles sooner than the seesaw's 64. Only a decode call's items
    (prefix_attention alone) add their design's decode_us."""
    from dataclasses import replace

    from kgen.model import call

    assert "startup_us" not in model.DESIGN_TERMS
    glm5 = spec("glm5_sm120")
    decode16, verify16, verify64 = (call(glm5, shape, "sm_90", plan_for="sm_90", tiles=tiles) for shape, tiles in (
        (Shape(8, 1, 4096, 1), MmaSyncTiles(16, 32, 1, 4, 1)), (Shape(8, 16, 4096, 1), MmaSyncTiles(16, 32, 1, 4, 1)),
        (Shape(8, 16, 4096, 1), SeesawTiles())))
    state = 512 * 4 + 4  # a partial state's row: fp32 o and its lse
    assert decode16.item_bytes == 8 * 576 * 2 + 16 * state  # H = 8 rows of Q in a 16-row tile
    assert verify16.item_bytes == 16 * 576 * 2 + 16 * state and verify64.item_bytes == 64 * (576 * 2 + state)
    assert decode16.startup_us(CAL) == pytest.approx(CAL.startup_us + decode16.item_bytes / 20e3)
    assert decode16.startup_us(CAL) < verify16.startup_us(CAL) < verify64.startup_us(CAL)
    decode_path = replace(CAL, decode_us=3.0)
    assert decode16.startup_us(decode_path) == pytest.approx(decode16.startup_us(CAL) + 3.0)
    assert verify16.startup_us(decode_path) == verify16.startup_us(CAL)
    # a one-wave call's time moves by exactly its startup: the items start together
    slower = replace(CAL, item_gbps=10.0)
    assert decode16.predict(slower).us - decode16.predict(CAL).us == pytest.approx(decode16.item_bytes / 20e3)


def test_floor_uses_the_mma_type_of_the_spec():
    sm120 = get_arch("sm_120")
    bf16, e4m3 = floor(spec("glm5_sm120"), MAIN, sm120), floor(spec("glm5_fp8_mma_e4m3_sm120"), MAIN, sm120)
    assert bf16.flops == e4m3.flops == 2 * 16 * 8 * (131072 + 16) * (576 + 512)
    assert bf16.dram_us == pytest.approx(2 * e4m3.dram_us) and bf16.mma_us == pytest.approx(2 * e4m3.mma_us)
    assert bf16.us == pytest.approx((131072 + 16) * 1152 / 1792e3)  # DRAM-bound: 84 us
    assert floor(spec("glm5_fp8_sm120"), MAIN, sm120).mma_us == pytest.approx(bf16.mma_us)  # f16: bf16's rate


def test_predictions_name_what_binds_and_rank_tilings():
    glm5 = spec("glm5_sm120")
    main = predict(glm5, MAIN, "sm_120", cal=CAL)
    assert main.binding == "tensor" and 0 < main.pct_floor < 100
    assert predict(glm5, MAIN, "sm_90", cal=CAL).binding == "smem"  # the same plan on the H200
    assert predict(glm5, Shape(8, 1, 131072, 32), "sm_120", cal=CAL).binding == "dram"
    assert predict(glm5, Shape(8, 16, 4096, 1), "sm_120", cal=CAL).binding == "per-call"
    e4m3 = predict(spec("glm5_fp8_mma_e4m3_sm120"), MAIN, "sm_120", cal=CAL)
    assert e4m3.us < main.us and e4m3.pipes["tensor"] == pytest.approx(8 * 36 * 8192 / 2048, rel=0.01)  # QMMA: 2x
    ranked = rank_by_model(glm5, "sm_120", [MmaSyncTiles(32, 32, 2, 2), MmaSyncTiles(32, 16, 2, 4),
                                            MmaSyncTiles(32, 32, 2, 4)], shapes=[MAIN])
    # 4 stages of 32 bf16 rows need more than sm_120's 99 KB: not a candidate there
    assert {t for t, _ in ranked} == {MmaSyncTiles(32, 32, 2, 2), MmaSyncTiles(32, 16, 2, 4)}
    assert ranked[0][1] <= ranked[1][1]


def test_grid_uses_the_specs_heads_page_size_and_tree():
    shapes = grid(spec("glm5_sm120"))
    assert {s.H for s in shapes} == {8} and {s.page_size for s in shapes} == {1}
    assert {s.T for s in shapes} == {16, 64} and len(shapes) == 2 * 3 * 3  # max_nodes 64: no T=256
    assert {s.T for s in grid(spec("glm5_static5_sm120"))} == {5}


def test_an_fp8_verify_given_stored_tree_keys_does_not_pay_their_quantization():
    fp8, on_h200 = spec("glm5_fp8_sm120"), dict(plan_for="sm_90", tiles=WgmmaTiles(stages=3), cal=CAL)  # modeled
    given_bf16 = predict(fp8, MAIN, "sm_90", **on_h200).us
    stored = predict(fp8, Shape(8, 16, 131072, 1, stored_tree=True), "sm_90", **on_h200).us
    assert given_bf16 - stored == pytest.approx(CAL.quantize_us)
    bf16 = spec("glm5_sm120")  # bf16 keys are never quantized
    assert predict(bf16, MAIN, "sm_90", **on_h200).us == \
        predict(bf16, Shape(8, 16, 131072, 1, stored_tree=True), "sm_90", **on_h200).us


def test_partial_states_are_read_from_dram_only_when_the_call_outgrows_half_the_l2():
    from dataclasses import replace

    from kgen.model import call

    bf16, cal = spec("glm5_sm120"), replace(CAL, state_us=0.0)  # the combine's time: its bytes alone
    for shape, in_l2 in ((Shape(8, 16, 4096, 1, 64), True), (Shape(8, 16, 131072, 1, 64), False)):
        c = call(bf16, shape, "sm_90", plan_for="sm_120")
        partials = len(c.items) * c.plan.tiles.bm * (bf16.model.value_dim + 1) * 4
        no_l2 = replace(c, arch=replace(c.arch, l2_mb=0.0))  # every call outgrows it
        extra = no_l2.predict(cal).us - c.predict(cal).us
        assert extra == pytest.approx(0.0 if not in_l2 else partials / (c.arch.dram_gbps * 1e3), abs=1e-6), shape


def test_model_table_reads_dsa_rows_results_as_the_formats_they_ran(tmp_path):
    from bench import model_table

    measured = tmp_path / "dsa_rows.json"
    rows = [{"format": "fp8 656-B rows page 64", "spec": "glm5_dsa_fp8_sm120_p64", "plan": "wgmma", "plan_arch": "sm_90",
             "tiles": "wgmma:32,2,1", "B": 1, "L": 131072, "T": 16, "H": 8, "us": 144.7},
            {"format": "bf16 page 64", "spec": "glm5_sm120_p64", "plan": "wgmma", "plan_arch": "sm_90",
             "B": 32, "L": 32768, "T": 1, "H": 8, "us": 416.0}]
    measured.write_text(json.dumps({"device": "NVIDIA H200", "plan_arch": None, "rows": rows}))
    dsa, bf16 = model_table.load_rows([measured], {})
    assert dsa["spec"].cache.per_block and dsa["spec"].cache.page_size == 64 and dsa["shape"].stored_tree
    assert bf16["spec"].cache.kv_dtype == "bfloat16" and bf16["shape"] == Shape(8, 1, 32768, 32, 64, stored_tree=True)
    assert dsa["shape_name"] == "B1_L131072_T16" and dsa["variant"] != bf16["variant"]
    (c,) = model_table.calls([dsa])
    assert c.plan.tiles == WgmmaTiles(stages=2) and c.plan.arch.name == "sm_90"  # the tiling the row ran
    assert bf16["tiles"] is None  # a row without its tiling: the H200's heuristic plan


def test_model_table_models_bench_run_rows_with_the_tilings_their_plan_chose(tmp_path):
    """A bench.run result that records its plan (arch, tuned table found or not): each row runs the
    tiling the runtime's PlanChoice gives its batch (the table's bucket, else the heuristic); older
    files (no "plans") ran the spec's sm_120 plan; a file whose table this checkout lacks is refused."""
    from bench import model_table
    from bench.run import spec_for
    from kgen.choice import PlanChoice

    row = {"H": 8, "T": 1, "L": 131072, "B": 32, "page_size": 1, "us": 1215.8}
    wide = {"H": 16, "T": 16, "L": 131072, "B": 1, "page_size": 1, "us": 147.7}
    spec_path = "specs/glm5_sm120.yaml"
    spec = load_spec(ROOT / spec_path)
    h16_name = spec_for(spec, 16, 16, 1).name
    measured = tmp_path / "grid.json"
    measured.write_text(json.dumps({"spec": "glm5_sm120", "spec_path": spec_path, "rows": [row, wide], "plans": {
        "glm5_sm120": {"arch": "sm_90", "tiles": "seesaw:32,4,1", "tuned": "glm5_sm120-sm_90.json"},
        h16_name: {"arch": "sm_90", "tiles": "seesaw:32,4,1", "tuned": None}}}))
    decode, h16 = model_table.load_rows([measured], {})
    table = PlanChoice.find(spec, get_arch("sm_90")).table
    assert table is not None and decode["plan_for"] == "sm_90"
    assert decode["tiles"] == table.tiles_for(Bucket.of(32, 32, 32 * 131072))  # the bucket's choice
    assert decode["shape_name"] == "B32_L131072_T1_H8" and not decode["shape"].stored_tree  # nothing recorded
    stored = tmp_path / "stored.json"
    stored.write_text(json.dumps({**json.loads(measured.read_text()), "tree_keys": "as the cache stores them"}))
    assert all(r["shape"].stored_tree for r in model_table.load_rows([stored], {}))  # no quantization to pay
    assert h16["spec"].model.num_q_heads == 16 and h16["tiles"] == SeesawTiles()  # no table: the heuristic
    legacy = tmp_path / "old.json"
    legacy.write_text(json.dumps({"spec": "glm5_sm120", "spec_path": spec_path, "rows": [row]}))
    (old,) = model_table.load_rows([legacy], {})
    assert old["plan_for"] is None and old["tiles"] is None  # the spec's own (sm_120) plan
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"spec": "glm5_sm120", "spec_path": spec_path, "rows": [wide], "plans": {
        h16_name: {"arch": "sm_90", "tiles": "seesaw:32,4,1", "tuned": "gone.json"}}}))
    with pytest.raises(SystemExit, match="tilings are unknown"):
        model_table.load_rows([missing], {})


def test_calibration_file_holds_the_fit_and_its_validation():
    """The shipped fit and how far it is from its H200 pairs: rms within 10%; the worst pair may be
    far (docs/performance_model.md names it: since the twenty-ninth session the pairs include today's
    tuned sm_90 tables, whose 4-stage row-block decode the model's DRAM term, blind to ring depth,
    misses by ~35%)."""
    data = json.loads(model.CALIBRATION_FILE.read_text())
    assert Calibration(**data["calibration"]) == model.calibration()
    assert data["validation"]["pairs"] >= 9 and data["validation"]["rms_error_pct"] <= 10
    assert data["validation"]["max_abs_error_pct"] <= 40
    assert f"{data['validation']['pairs']} H200 measurements" in model.validation()


def test_show_prints_the_model_with_its_binding_resource_and_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    out = CliRunner().invoke(app, ["show", str(SPEC_DIR / "glm5_sm120.yaml")])
    assert out.exit_code == 0, out.output
    assert "MODEL, not a measurement" in out.stdout and "model µs" in out.stdout
    assert model.validation().split(";")[0] in " ".join(out.stdout.split())
    assert "binding" in out.stdout and "tensor" in out.stdout
    assert "registers+smem" in out.stdout  # occupancy and its limit, next to the ptxas report


def test_model_table_fits_and_writes_the_validation(tmp_path, monkeypatch):
    from bench import model_table

    measured = tmp_path / "m.json"
    rows = [{"variant": "sm120_plan", "spec_path": "specs/glm5_sm120.yaml", "plan_for": "sm_120", "tiles": None,
             "shape": "compute", "H": 8, "T": 16, "L": 131072, "B": 1, "page_size": 1, "us": 193.2},
            {"variant": "bn16", "spec_path": "specs/glm5_sm120.yaml", "plan_for": "sm_120", "tiles": [32, 16, 2, 4, 1],
             "shape": "memory", "H": 8, "T": 1, "L": 131072, "B": 1, "page_size": 1, "us": 90.0}]
    measured.write_text(json.dumps({"rows": rows}))
    doc = tmp_path / "performance_model.md"
    doc.write_text(f"intro\n{model_table.BEGIN}\nold\n{model_table.END}\noutro\n")
    monkeypatch.setattr(model_table, "DOCS", doc)
    monkeypatch.setattr(model_table, "OUT", tmp_path / "validation.json")
    monkeypatch.setattr(model_table, "SM120_SPECS", ("glm5_sm120",))
    monkeypatch.setattr(model, "CALIBRATION_FILE", tmp_path / "calibration.json")
    (tmp_path / "calibration.json").write_text(json.dumps({"calibration": vars(CAL), "validation": {}}))
    model.calibration.cache_clear()
    try:
        assert model_table.main([str(measured), "--fit"]) == 0
        result = json.loads((tmp_path / "validation.json").read_text())
        assert result["validation"]["pairs"] == 2 and {r["class"] for r in result["pairs"]} == {"compute", "memory"}
        assert json.loads((tmp_path / "calibration.json").read_text())["validation"] == result["validation"]
        text = doc.read_text()
        assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
        assert "Predicted sm_120 times (MODEL" in text and "| bn16 | memory |" in text
        # leave one shape out: each pair predicted by a fit on the other shape only
        assert model_table.main([str(measured), "--fit", "--cross-validate"]) == 0
        result = json.loads((tmp_path / "validation.json").read_text())
        assert result["cross_validation"]["shapes"] == ["compute", "memory"]
        assert all("cv_error_pct" in r for r in result["pairs"])
        assert result["cross_validation"]["max_abs_error_pct"] == max(abs(r["cv_error_pct"]) for r in result["pairs"])
        assert "Leave one shape out" in doc.read_text()
    finally:
        model.calibration.cache_clear()


@pytest.mark.parametrize("arch, threads, regs, smem, ctas, limit", [
    ("sm_120", 256, 187, 96000, 1, "registers+smem"),  # 192 regs x 8 warps; 97 KB of 100 KB
    ("sm_120", 128, 64, 0, 8, "registers"),  # 2048 regs per warp: 32 warps
    ("sm_120", 256, 32, 0, 6, "warps"),  # 48 warps per SM
    ("sm_120", 32, 16, 0, 32, "blocks"),
    ("sm_120", 128, 32, 40 * 1024, 2, "smem"),  # 41 KB per CTA against 100 KB
    ("sm_90", 256, 187, 96000, 1, "registers"),  # 228 KB of smem would fit 2
    ("sm_120", 1024, 255, 0, 0, "registers"),  # 256 x 32 x 32 warps > 64K: cannot launch
    ("sm_120", 128, 32, 100 * 1024, 0, "smem"),  # over the 99 KB per block
    # registers are a sub-partition's (16K, whole warps): 5-warp CTAs two an SM need <= 170 a thread, and
    # a 9-warp CTA is checked as 12 warps (what ptxas caps __launch_bounds__(160, 2) and (288, 1) at: 168)
    ("sm_90", 160, 168, 0, 2, "registers"),  # 3 warps a sub-partition: 12 an SM
    ("sm_90", 160, 200, 0, 1, "registers"),  # 2 a sub-partition: 8 an SM, though 10 x 6400 <= 64K
    ("sm_120", 288, 168, 0, 1, "registers"),
    ("sm_120", 288, 176, 0, 0, "registers"),  # 12 x 5632 > 64K: cannot launch
])
def test_occupancy_names_the_limiting_resource(arch, threads, regs, smem, ctas, limit):
    occ = occupancy(arch, threads, regs, smem)
    assert (occ.ctas_per_sm, occ.limit) == (ctas, limit)
    assert occ.warps_per_sm == ctas * threads // 32


# ---- the sparse model (kgen/sparse_model.py, bench/sparse_model_table.py) ----

def sparse_call(shape: Shape, shared: float = 0.7, plan_for: str = "sm_90", **kw):
    from kgen.sparse_model import SparseShape, predict_sparse

    return predict_sparse(spec("glm5_dsa_sm120"), SparseShape(shape, shared), "sm_90", plan_for=plan_for, **kw)


def test_the_sparse_model_runs_the_kernel_the_step_picks_or_the_one_asked_for():
    b1, b32 = Shape(8, 16, 131072, 1, 64), Shape(8, 16, 32768, 32, 64)
    assert sparse_call(b1).us == sparse_call(b1, kernel="gather").us != sparse_call(b1, kernel="union").us
    assert sparse_call(b32).us == sparse_call(b32, kernel="union").us < sparse_call(b32, kernel="gather").us


def test_a_sparse_tile_takes_at_least_its_chain_and_a_union_item_pays_its_list():
    from dataclasses import replace

    from kgen.sparse_model import sparse_calibration

    cal, b8, t1 = sparse_calibration(), Shape(8, 16, 131072, 8, 64), Shape(8, 1, 131072, 1, 64)
    union = sparse_call(b8, kernel="union", cal=cal)
    assert union.binding == "latency"
    assert sparse_call(b8, kernel="union", cal=replace(cal, chain_us=2 * cal.chain_us)).us > 1.5 * union.us
    assert sparse_call(b8, kernel="union", cal=replace(cal, chain_us=0.0)).binding in ("tensor", "smem", "issue")
    costly_list = replace(cal, scan_cycles=cal.scan_cycles + 1, insert_cycles=cal.insert_cycles + 1)
    assert sparse_call(b8, kernel="union", cal=costly_list).us > union.us
    assert sparse_call(b8, kernel="gather", cal=costly_list).us == sparse_call(b8, kernel="gather", cal=cal).us
    # a one-token tile's union lists its entries as they are (bench/NOTES.md v52): no build to pay
    assert sparse_call(t1, kernel="union", cal=costly_list).us == sparse_call(t1, kernel="union", cal=cal).us


def test_sparse_model_table_reads_both_kernels_of_each_bench_sparse_row_and_fits_them(tmp_path):
    from dataclasses import replace

    from bench import sparse_model_table as table
    from kgen.sparse_model import sparse_calibration

    rows = [{"B": b, "L": length, "T": 16, "shared": 0.7, "us_union": 1.0, "us_gather": 1.0, "default": "union"}
            for b, length in ((1, 131072), (8, 131072), (32, 32768))]
    result = tmp_path / "sparse.json"
    result.write_text(json.dumps({"spec": "glm5_dsa_sm120", "plan_arch": "sm_120", "device": "test", "rows": rows}))
    pairs = table.load_pairs([result])
    assert [(p["B"], p["kernel"], p["default"]) for p in pairs] == [
        (1, "union", True), (1, "gather", False), (8, "union", True), (8, "gather", False),
        (32, "union", True), (32, "gather", False)]
    truth = replace(sparse_calibration(), chain_us=2.5, combine_us=3.0)
    for p in pairs:  # measurements the model makes with known terms: the fit finds them again
        p["us"] = table.modeled(p, truth)
    assert pairs[1]["us"] == sparse_call(Shape(8, 16, 131072, 1, 64), plan_for="sm_120", kernel="gather", cal=truth).us
    fitted = table.fit(pairs, sparse_calibration())
    assert table.loss(pairs, fitted) < 1e-4 < table.loss(pairs, sparse_calibration())
    assert fitted.chain_us == pytest.approx(2.5, rel=0.05)
    assert all(getattr(fitted, t) == getattr(truth, t) for t in table.MEASURED)  # traced or measured: not refitted


def test_the_shipped_sparse_terms_are_the_docs_and_hold_out_of_sample():
    """docs/performance_model.md's sparse block is bench.sparse_model_table's output for the shipped terms:
    every pair within 10% rms, and each plan's pairs within 15% rms under the other plan's terms."""
    import re

    from bench import sparse_model_table as table
    from kgen.sparse_model import SparseCalibration, sparse_calibration

    data = json.loads(model.CALIBRATION_FILE.read_text())["sparse"]
    assert SparseCalibration(**data) == sparse_calibration()
    block = (ROOT / "docs" / "performance_model.md").read_text().split(table.BEGIN)[1].split(table.END)[0]
    assert ", ".join(f"{k} {v}" for k, v in data.items()) in block
    rms = [float(x) for x in re.findall(r"rms ([0-9.]+)%", block)]
    assert len(rms) == 3 and rms[0] <= 10 and max(rms[1:]) <= 15, rms
