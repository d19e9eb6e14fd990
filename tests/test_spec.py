"""Spec loading and validation: every bad value is one line naming the file, field and value."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kgen
from kgen.errors import SpecError
from kgen.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "specs").glob("*.yaml"))


def base() -> dict:
    return yaml.safe_load((ROOT / "specs" / "glm5_sm120.yaml").read_text())


def with_(path: str, value, data: dict | None = None):
    data = data if data is not None else base()
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    node[leaf] = value
    return data


def test_default_spec_is_design_section_4():
    s = kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml")
    assert (s.model.num_q_heads, s.model.kv_lora_rank, s.model.qk_rope_head_dim) == (8, 512, 64)
    assert s.model.head_dim == 576 and s.model.softmax_scale == 0.0625
    assert (s.cache.page_size, s.cache.kv_dtype, s.tree.max_nodes, s.target.arch) == (1, "bfloat16", 64, "sm_120")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_specs_load(path):
    assert kgen.load_spec(path).name == path.stem


@pytest.mark.parametrize("data, field, words", [
    ({**base(), "extra": 1}, "extra", "unknown key"),
    (with_("model.heads", 8), "model.heads", "unknown key"),
    (with_("cache.page_size", 3), "cache.page_size", "power of two"),
    (with_("model.kv_lora_rank", 500), "model.kv_lora_rank", "multiple of 64"),
    (with_("target.arch", "sm_75"), "target.arch", "unknown arch"),
    (with_("tree", {"parents": [-1, 2, 1]}), "tree", "cycle"),
    (with_("tree", {"parents": [-1, 0, -1]}), "tree", "exactly one root"),
    (with_("tree", {"parents": [-1, 2, 0]}), "tree", "before their children"),
    (with_("tree.max_nodes", 0), "tree.max_nodes", "greater than or equal to 1"),
    (with_("tree.max_nodes", 2048), "tree.max_nodes", "less than or equal to 1024"),
    (with_("model.softmax_scale", -1.0), "model.softmax_scale", "greater than 0"),
    (with_("cache.kv_dtype", "float16"), "cache.kv_dtype", "bfloat16"),
    (with_("model.kv_lora_rank", 192, with_("cache", {"page_size": 1, "kv_dtype": "float8_e4m3fn", "mma": "e4m3"})),
     "cache.mma", "multiple of 128"),
    (with_("cache.mma", "e4m3"), "cache.mma", "a bfloat16 cache always runs bf16 MMAs"),
    (with_("cache", {"page_size": 1, "kv_dtype": "float8_e4m3fn", "mma": "bf16"}), "cache.mma", "16-bit mode is f16"),
    (with_("cache.scales", "per_block"), "cache.scales", "a bfloat16 cache has none"),
    (with_("cache", {"page_size": 64, "kv_dtype": "float8_e4m3fn", "scales": "per_row"}), "cache.scales", "per_tensor"),
    (with_("model.kv_lora_rank", 256, with_("cache", {"page_size": 64, "kv_dtype": "float8_e4m3fn",
                                                      "scales": "per_block"})), "cache.scales", "kv_lora_rank = 4 x 128"),
])
def test_bad_spec_names_the_field(data, field, words):
    with pytest.raises(SpecError) as e:
        parse_spec(data, "bad.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"bad.yaml: {field}") and words in msg, msg


def test_fp8_mma_precision_defaults_to_f16():
    fp8 = with_("cache", {"page_size": 1, "kv_dtype": "float8_e4m3fn"})
    assert parse_spec(fp8).cache.mma_type == "f16"
    assert parse_spec(with_("cache.mma", "e4m3", fp8)).cache.mma_type == "e4m3"
    assert parse_spec(base()).cache.mma_type == "bf16"


def test_per_block_scales_select_the_dsa_pool_rows():
    s = kgen.load_spec(ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml")
    assert s.cache.per_block and s.cache.page_size == 64 and s.cache.mma_type == "f16"
    per_tensor = parse_spec(with_("cache", {"page_size": 1, "kv_dtype": "float8_e4m3fn"}))
    assert per_tensor.cache.scales is None and not per_tensor.cache.per_block  # the default: one kv_scale
    assert not parse_spec(with_("cache.scales", "per_tensor", with_("cache.kv_dtype", "float8_e4m3fn"))).cache.per_block


def test_static_tree_sets_nodes():
    s = parse_spec(with_("tree", {"parents": [-1, 0, 0, 1]}))
    assert s.tree.is_static and s.tree.nodes == 4 and s.tree.mask_words == 1


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read spec"):
        kgen.load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        kgen.load_spec(bad)


@pytest.mark.parametrize("mutation", [{"cache.page_size": 3}, {"target.arch": "sm_75"}])
def test_cli_user_error_is_one_line_without_traceback(tmp_path, mutation):
    (path, value), = mutation.items()
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(with_(path, value)))
    r = subprocess.run([sys.executable, "-m", "kgen", "build", str(spec), "--out", str(tmp_path / "gen")],
                       capture_output=True, text=True, env={"KGEN_CACHE_DIR": str(tmp_path / "c"), "PATH": ""})
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and path in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
