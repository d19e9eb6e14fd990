"""The labelled sm_120 performance model and the occupancy calculator (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgen.arch import get_arch
from kgen.cli import app
from kgen.model import GRID_L, NO_MEASUREMENT, BenchResultError, Shape, floor, grid, model
from kgen.occupancy import occupancy
from kgen.spec import load_spec

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"


@pytest.fixture
def glm5():
    return load_spec(SPEC_DIR / "glm5_sm120.yaml")


def _row(shape: Shape, us: float, pct: float, spec: str = "glm5_sm120") -> dict:
    return {"spec": spec, "H": shape.H, "T": shape.T, "L": shape.L, "B": shape.B,
            "page_size": shape.page_size, "us": us, "pct_floor": pct}


def test_floor_matches_the_design_numbers():
    # DESIGN §1: B=1, L=131072, T=16 on the H200: ~0.12 ms at H=16, 58 us at H=8; both mma-bound.
    tp4, tp8 = load_spec(SPEC_DIR / "glm5_tp4_sm120.yaml"), load_spec(SPEC_DIR / "glm5_sm120.yaml")
    h200 = get_arch("sm_90")
    f16 = floor(tp4, Shape(16, 16, 131072, 1, 1), h200)
    f8 = floor(tp8, Shape(8, 16, 131072, 1, 1), h200)
    assert f16.bound == f8.bound == "mma"
    assert f16.us == pytest.approx(116, rel=0.02) and f8.us == pytest.approx(58, rel=0.02)
    assert f8.flops == 2 * 16 * 8 * (131072 + 16) * (576 + 512)
    # KV read once dominates the bytes; on sm_120 the same shape is DRAM-bound.
    assert f8.bytes > 131072 * 576 * 2
    assert floor(tp8, Shape(8, 16, 131072, 1, 1), get_arch("sm_120")).bound == "dram"


def test_grid_uses_the_specs_heads_page_size_and_tree(glm5):
    shapes = grid(glm5)
    assert {s.H for s in shapes} == {8} and {s.page_size for s in shapes} == {1}
    assert {s.T for s in shapes} == {16, 64}  # max_nodes 64: T=256 cannot run on this spec
    assert {s.L for s in shapes} == set(GRID_L) and len(shapes) == 2 * 3 * 3
    static = grid(load_spec(SPEC_DIR / "glm5_static5_sm120.yaml"))
    assert {s.T for s in static} == {5}


def test_without_measurements_the_model_is_the_floor_and_says_so(glm5, tmp_path):
    rows, files = model(glm5, "sm_120", tmp_path)
    assert files == []
    assert all(m.us == m.floor.us and m.source == NO_MEASUREMENT for m in rows)
    assert all(m.row()["kind"] == "model" for m in rows)


def test_model_divides_the_floor_by_the_newest_h200_efficiency_of_the_same_plan(glm5, tmp_path):
    a, b, c = grid(glm5)[:3]
    (tmp_path / "glm5_sm120-20260101-000000.json").write_text(json.dumps(
        [_row(a, 99.0, 10.0), _row(b, 30.0, 20.0)]))  # a bare list of rows
    (tmp_path / "glm5_sm120-20260201-000000-p64.json").write_text(json.dumps({"rows": [  # kgen bench's object
        _row(a, 50.0, 40.0),
        _row(c, 1.0, 90.0, spec="glm5_sm120_h8_n256_p1"),  # another plan (a derived spec): ignored
        {**_row(c, 1.0, 90.0), "mode": "decode"},  # decode rows are not verify shapes: ignored
        {**_row(c, None, None), "notes": ["skipped: out of memory"]},  # not timed: ignored
    ]}))
    (tmp_path / "glm5_sm120_other-20270101-000000.json").write_text("not json")  # another spec's file
    rows, files = model(glm5, "sm_120", tmp_path)
    assert [f.name for f in files] == ["glm5_sm120-20260101-000000.json", "glm5_sm120-20260201-000000-p64.json"]
    ma, mb, mc = rows[:3]
    assert ma.efficiency == pytest.approx(0.4) and ma.us == pytest.approx(ma.floor.us / 0.4)  # newest file wins
    assert "40.0% of floor" in ma.source and "20260201" in ma.source and ma.measured_us == 50.0
    assert mb.efficiency == pytest.approx(0.2) and "20260101" in mb.source  # only in the older file
    assert all(m.source == NO_MEASUREMENT and m.efficiency == 1.0 for m in [mc, *rows[3:]])


def test_malformed_bench_result_is_a_clear_error(glm5, tmp_path):
    (tmp_path / "glm5_sm120.json").write_text(json.dumps([{"spec": "glm5_sm120", "H": 8, "us": "fast"}]))
    with pytest.raises(BenchResultError, match=r"row 0: missing or mistyped T, L, B, page_size, us"):
        model(glm5, "sm_120", tmp_path)


def test_show_prints_the_model_labelled_with_its_efficiency(glm5, tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    results = tmp_path / "results"
    results.mkdir()
    shape = Shape(8, 16, 131072, 1, 1)
    (results / "glm5_sm120.json").write_text(json.dumps([_row(shape, 80.0, 72.5)]))
    out = CliRunner().invoke(app, ["show", str(SPEC_DIR / "glm5_sm120.yaml"), "--results", str(results)])
    assert out.exit_code == 0, out.output
    assert "MODEL, not a measurement" in out.stdout and "(model)" in out.stdout
    assert "1 of 18 shapes measured" in out.stdout
    assert "72.5% of floor" in out.stdout and NO_MEASUREMENT in out.stdout
    assert "registers+smem" in out.stdout  # occupancy and its limit, next to the ptxas report


@pytest.mark.parametrize("arch, threads, regs, smem, ctas, limit", [
    ("sm_120", 256, 187, 96000, 1, "registers+smem"),  # 192 regs x 8 warps; 97 KB of 100 KB
    ("sm_120", 128, 64, 0, 8, "registers"),  # 2048 regs per warp: 32 warps
    ("sm_120", 256, 32, 0, 6, "warps"),  # 48 warps per SM
    ("sm_120", 32, 16, 0, 32, "blocks"),
    ("sm_120", 128, 32, 40 * 1024, 2, "smem"),  # 41 KB per CTA against 100 KB
    ("sm_90", 256, 187, 96000, 1, "registers"),  # 228 KB of smem would fit 2
    ("sm_120", 1024, 255, 0, 0, "registers"),  # 256 x 32 x 32 warps > 64K: cannot launch
    ("sm_120", 128, 32, 100 * 1024, 0, "smem"),  # over the 99 KB per block
])
def test_occupancy_names_the_limiting_resource(arch, threads, regs, smem, ctas, limit):
    occ = occupancy(arch, threads, regs, smem)
    assert (occ.ctas_per_sm, occ.limit) == (ctas, limit)
    assert occ.warps_per_sm == ctas * threads // 32
