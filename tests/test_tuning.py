"""Tuned tables on the CPU: bucketing, keying (spec digest, arch, kgen version), loading (the user's
before a shipped one), the re-run rule, and the fallback to the heuristic plan."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import kgen
from kgen import tuning
from kgen.arch import get_arch
from kgen.choice import PlanChoice
from kgen import designs
from kgen.designs import MmaSyncTiles, OverlapTiles, SeesawTiles, WgmmaTiles
from kgen.errors import PlanError
from kgen.plan import plan
from kgen.spec import parse_spec
from kgen.tuning import Bucket, Choice, Table, TuningError, decide, find_table, parse_tiles

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def spec():
    return kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml")


@pytest.fixture
def user_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    return tmp_path / "tuned"


def table(spec, arch="sm_90", **choices) -> Table:
    return Table(spec.name, tuning.spec_digest(spec), arch, kgen.__version__, "test GPU",
                 {k: Choice(parse_tiles(t), 1.0, 2.0, 0.01) for k, t in choices.items()})


@pytest.mark.parametrize("tokens, batch, context, key", [
    (1, 1, 131072, "decode/1/longest"), (32, 32, 32 * 4096, "decode/9+/short"), (16, 1, 8192, "small/1/short"),
    (17, 1, 8193, "mid/1/long"), (8 * 64, 8, 8 * 32768, "mid/2-8/long"), (9 * 65, 9, 0, "large/9+/short"),
    (16, 1, 65536, "small/1/long"), (16, 1, 65537, "small/1/longest")])
def test_a_batch_falls_in_the_bucket_of_what_the_host_knows(tokens, batch, context, key):
    assert Bucket.of(tokens, batch, context).key == key


def test_every_bucket_has_a_representative_shape_within_the_tree(spec):
    keys = [b.key for b in tuning.buckets()]
    assert len(keys) == len(set(keys)) == 36
    for b in tuning.buckets():
        t, batch, length = tuning.shape_of(b, spec.tree.nodes)
        bucket = Bucket.of(t * batch, batch, length * batch)  # (a tree class past the spec's nodes is capped)
        assert 1 <= t <= spec.tree.nodes and (bucket.batch, bucket.context) == (b.batch, b.context)


def test_tune_takes_a_subset_of_buckets_by_the_start_of_their_keys():
    assert [b.key for b in tuning.selected(("decode/9+", "large/1/short"))] == [
        "decode/9+/short", "decode/9+/long", "decode/9+/longest", "large/1/short"]
    assert tuning.selected() == tuning.buckets()
    with pytest.raises(TuningError, match="starts with 'decode/10'.*decode/1/short"):
        tuning.selected(("decode/10",))


def test_a_table_from_before_the_longest_context_class_answers_for_it_with_its_long_choice(spec):
    """Contexts past 65536 tokens are their own class; a table without it (every table tuned before
    it existed) runs its "long" choice there, and one with it its own."""
    old = table(spec, **{"small/1/long": "wgmma:32,3,1"})
    assert old.tiles_for(Bucket.of(16, 1, 131072)) == WgmmaTiles(stages=3)
    assert old.tiles_for(Bucket.of(16, 1, 4096)) is None  # no fallback for the other classes
    new = table(spec, **{"small/1/long": "wgmma:32,3,1", "small/1/longest": "seesaw:32,3,1"})
    assert new.tiles_for(Bucket.of(16, 1, 131072)) == SeesawTiles(stages=3)
    assert new.tiles_for(Bucket.of(16, 1, 32768)) == WgmmaTiles(stages=3)


def test_tiles_text_round_trips_and_bad_text_names_the_forms():
    for t in (WgmmaTiles(), WgmmaTiles(stages=3), MmaSyncTiles(32, 32, 2, 4, 1), OverlapTiles(16, 4, 1, 1),
              OverlapTiles(32, 2, 0, 1), MmaSyncTiles(32, 32, 2, 2, 1, 4)):
        assert parse_tiles(designs.text(t)) == t
    assert designs.text(MmaSyncTiles(32, 16, 2, 4, 1)) == "mma_sync:32,16,2,4,1"  # the tables' form
    assert designs.text(MmaSyncTiles(32, 32, 2, 2, 1, 4)) == "mma_sync:32,32,2,2,1,4"  # a cluster only when one
    assert parse_tiles("mma_sync:32,32,2,3,1,1,0") == MmaSyncTiles(32, 32, 2, 3, 1, 1, scales_in_v=0)
    assert parse_tiles("mma_sync:32,32,2,4,1,1,1,1") == MmaSyncTiles(32, 32, 2, 4, 1, 1, q_apart=1)
    for bad in ("wgmma:32", "mma_sync:32,32,2,x,1", "sparse:1,2", "mma_sync:32,32,2,2", "mma_sync:32,32,2,2,1,4,1,1,1"):
        with pytest.raises(TuningError, match="seesaw:BN,STAGES,MIN_BLOCKS or wgmma:BN,STAGES,MIN_BLOCKS or "
                                              "mma_sync:BM,BN,WARPS_M,STAGES,MIN_BLOCKS\\[,CLUSTER\\]\\[,SCALES_IN_V\\]\\[,Q_APART\\] or overlap:BN,STAGES,AHEAD,MIN_BLOCKS"):
            parse_tiles(bad)


def test_candidates_fit_the_arch(spec):
    sm90 = tuning.candidates(spec, get_arch("sm_90"))
    assert WgmmaTiles(stages=4) in sm90 and MmaSyncTiles(32, 32, 2, 4, 1) in sm90
    assert MmaSyncTiles(16, 32, 1, 4, 1) in sm90  # decode's 16-row tiles, the deepest ring that fits
    sm120 = tuning.candidates(spec, get_arch("sm_120"))  # 99 KB: no 4-stage ring of 32-row tiles
    assert sm120 == [MmaSyncTiles(32, 32, 2, 2, 1), MmaSyncTiles(32, 16, 2, 4, 1), MmaSyncTiles(16, 32, 1, 2, 1),
                     OverlapTiles(16, 4, 1, 1), OverlapTiles(16, 4, 0, 1), OverlapTiles(32, 2, 0, 1)]
    fp8 = tuning.candidates(kgen.load_spec(ROOT / "specs" / "glm5_fp8_sm120.yaml"), get_arch("sm_120"))
    assert not [t for t in fp8 if t.design == "overlap"]  # the overlap loop takes bf16 caches only
    with pytest.raises(PlanError, match="3\\+ with Q·K ahead"):
        plan(spec, "sm_120", tiles=OverlapTiles(32, 2, 1))  # would wait for a stage it has yet to refill


def test_tune_times_only_tilings_that_agree_with_the_heuristic_plan(spec):
    """Before a bucket is timed, each candidate runs once on its shape beside the heuristic plan: one
    that computes something else is rejected, with what differs, and never timed or kept."""
    import torch

    from kgen import reference
    from kgen.inputs import Dims
    from kgen.tuner import disagreeing

    dims = Dims.of(spec)

    class Module:  # the prefix op a decode bucket runs, as the reference computes it, plus `off`
        device = torch.device("cpu")

        def __init__(self, off: float):
            self.off = off

        def prefix_attention(self, *args, kv_scale):
            o, lse = reference.prefix_attention_ref(*args, dims.page_size, dims.scale, dims.value_dim, kv_scale)
            return o + self.off, lse

    mods = {"heuristic": Module(0.0), "same": Module(0.0), "wrong": Module(0.5)}
    bad = disagreeing(mods, "heuristic", spec, Bucket("decode", "1", "short"), torch.Generator().manual_seed(7))
    assert list(bad) == ["wrong"]
    assert "wrong against heuristic" in bad["wrong"] and "relative L2" in bad["wrong"]


def test_tune_for_an_arch_that_is_not_here_ranks_by_the_model():
    from typer.testing import CliRunner

    from kgen.cli import app

    r = CliRunner().invoke(app, ["tune", str(ROOT / "specs" / "glm5_sm120.yaml"), "--arch", "sm_120"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # prose wraps at the terminal's width
    assert "MODEL, not a measurement" in text and "no table is written" in text
    assert "mma_sync:32,32,2,2,1" in text and "mma_sync:32,16,2,4,1" in text


def test_a_rerun_changes_a_choice_only_past_the_noise():
    times = {"a": 100.0, "b": 98.5, "c": 99.0}
    assert decide(times, incumbent="a", noise=0.001) == "a"  # 1.5% < MIN_GAIN
    assert decide({**times, "b": 90.0}, incumbent="a", noise=0.001) == "b"
    assert decide({**times, "b": 90.0}, incumbent="a", noise=0.2) == "a"  # within a noisy machine's spread
    assert decide(times, incumbent="gone", noise=0.0) == "b"  # an incumbent no longer tried


def test_tables_are_keyed_by_spec_content_arch_and_version(spec, user_tables):
    t = table(spec, **{"small/1/short": "mma_sync:32,32,2,4,1"})
    t.save(user_tables / tuning.table_name(spec, "sm_90"))
    assert find_table(spec, "sm_90").tiles_for(Bucket("small", "1", "short")) == MmaSyncTiles(32, 32, 2, 4, 1)
    assert find_table(spec, "sm_90").tiles_for(Bucket("mid", "1", "long")) is None  # heuristic there
    assert find_table(spec, "sm_120") is None
    other = parse_spec({**spec.model_dump(), "model": {**spec.model.model_dump(), "softmax_scale": 0.07}})
    assert other.name == spec.name and find_table(other, "sm_90") is None  # same name, other content


def test_a_table_of_another_kgen_version_is_ignored(spec, user_tables):
    path = table(spec).save(user_tables / tuning.table_name(spec, "sm_90"))
    data = json.loads(path.read_text())
    data["kgen_version"] = "0.0.1"
    path.write_text(json.dumps(data))
    assert find_table(spec, "sm_90").path.parent == tuning.SHIPPED_DIR  # the stale one is passed over


def test_the_users_table_comes_before_the_shipped_one(spec, user_tables):
    shipped = find_table(spec, "sm_90")
    assert shipped is not None and shipped.path.parent == tuning.SHIPPED_DIR  # kgen tune on the H200
    assert set(shipped.choices) == {b.key for b in tuning.buckets()}  # every bucket, the longest class too
    mine = table(spec, **{"mid/1/long": "mma_sync:32,32,2,2,1"})
    mine.save(user_tables / tuning.table_name(spec, "sm_90"))
    assert find_table(spec, "sm_90").path.parent == user_tables


def test_a_corrupt_table_is_an_error_that_names_it(spec, user_tables):
    path = user_tables / tuning.table_name(spec, "sm_90")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(TuningError, match=str(path)):
        find_table(spec, "sm_90")


def test_a_batch_runs_its_bucket_choice_else_the_heuristic(spec, user_tables):
    arch = get_arch("sm_90")
    choice = PlanChoice(designs.choose(spec, arch), table(spec, **{"decode/9+/long": "mma_sync:32,32,2,4,1"}))
    assert choice.tilings() == [SeesawTiles(), MmaSyncTiles(32, 32, 2, 4, 1)]
    assert choice.tiles_for(32, 32, 32 * 32768, 8) == MmaSyncTiles(32, 32, 2, 4, 1)
    assert choice.tiles_for(16, 1, 131072, 8) == SeesawTiles()  # a bucket the table leaves out
    assert PlanChoice.find(spec, arch) == PlanChoice(SeesawTiles(), find_table(spec, "sm_90"))  # the shipped table
    forced = PlanChoice.find(spec, arch, MmaSyncTiles(32, 16, 2, 4))
    assert forced.table is None and forced.tiles_for(32, 32, 32 * 32768, 8) == MmaSyncTiles(32, 16, 2, 4)


def test_the_sm120_plan_runs_in_clusters_only_where_multicast_is_fast_and_a_request_has_row_tiles_to_share(spec):
    """The heuristic mma.sync tiling, fitted per batch: clusters of 2 on an H200 (sm_90a multicast)
    where a request has more than one 32-row tile; never on sm_120 (ptxas: multicast is slow there),
    never for decode at H = 8 (one row tile), never past a tuned table's choice or a forced tiling."""
    sm120, heuristic = get_arch("sm_120"), designs.choose(spec, get_arch("sm_120"))
    on_h200 = PlanChoice.find(spec, sm120, cubin_arch=get_arch("sm_90"))
    clustered = dataclasses.replace(heuristic, cluster=2)
    assert on_h200.tilings() == [heuristic, clustered]
    assert on_h200.tiles_for(16, 1, 131072, 8) == clustered  # 128 rows: 4 row tiles
    assert on_h200.tiles_for(8 * 4, 8, 8 * 4096, 8) == heuristic  # T = 4: 32 rows, one row tile
    assert on_h200.tiles_for(32, 32, 32 * 131072, 8) == heuristic  # decode
    on_sm120 = PlanChoice.find(spec, sm120, cubin_arch=sm120)
    assert on_sm120.tilings() == [heuristic] and on_sm120.tiles_for(16, 1, 131072, 8) == heuristic
    assert PlanChoice.find(spec, sm120, heuristic, get_arch("sm_90")).tiles_for(16, 1, 131072, 8) == heuristic
