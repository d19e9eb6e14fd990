"""The command line as a user meets it: the build table at 80 columns, errors printed as written,
--version, `kgen show` independent of the working directory, line info naming files that exist.
Each command runs as `python -m kgen` in a fresh process, as a user would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kgen
from kgen.model import grid

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "glm5_sm120.yaml"
KERNELS = ("prefix_attn", "tree_attn", "verify_attn", "lse_merge_bf16", "lse_merge_f32", "lse_combine", "kv_defrag")


def kgen_cli(*args, cwd=None, columns: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "kgen", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_version():
    r = kgen_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kgen {kgen.__version__}"


def test_the_build_table_at_80_columns_shows_every_kernels_name_status_and_spills(tmp_path):
    r = kgen_cli("build", SPEC, "--arch", "sm_120", "--arch", "sm_90", "--out", tmp_path, columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert "for sm_120 (mma_sync), sm_90 (wgmma)" in r.stdout  # the title names every arch built, with its loop
    rows = [line.split() for line in lines if line.split() and line.split()[0] in KERNELS]
    assert sorted((row[0], row[1]) for row in rows) == sorted((k, a) for k in KERNELS for a in ("sm_120", "sm_90"))
    header = next(line.split() for line in lines if line.split()[:2] == ["kernel", "arch"])
    for row in rows:
        cells = dict(zip(header, row))
        assert cells["status"] in ("compiled", "cached") and cells["spill"].isdigit()


def test_wide_adds_the_variant_id_and_sass(tmp_path):
    r = kgen_cli("build", SPEC, "--out", tmp_path, "--wide", columns=250)
    assert r.returncode == 0 and "variant id" in r.stdout and "HMMA" in r.stdout


def test_errors_are_printed_as_written_not_as_markup(tmp_path):
    data = yaml.safe_load(SPEC.read_text())
    data["name"] = "Bad[name]"
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(data))
    r = kgen_cli("build", spec, "--out", tmp_path)
    assert r.returncode == 1
    assert "'Bad[name]'" in r.stderr and "'^[a-z][a-z0-9_]{0,63}$'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_show_models_the_same_times_from_any_working_directory(tmp_path):
    here, elsewhere = kgen_cli("show", SPEC, cwd=ROOT), kgen_cli("show", SPEC, cwd=tmp_path)
    assert here.returncode == 0 and elsewhere.returncode == 0, elsewhere.stderr
    assert here.stdout == elsewhere.stdout
    spec = kgen.load_spec(SPEC)
    modeled = [line.split("│")[1:6] for line in here.stdout.splitlines() if line.count("│") == 12]
    # one row of the modeled table per shape of the benchmark grid, in its order (H, T, L, B, page)
    assert [[int(c) for c in row] for row in modeled] == [[s.H, s.T, s.L, s.B, s.page_size] for s in grid(spec)]


def test_line_info_names_files_that_exist():
    r = kgen_cli("inspect", SPEC, "lse_combine", "--line-info")
    assert r.returncode == 0, r.stderr
    files = set(re.findall(r'//## File "([^"]+)"', r.stdout))
    assert files and all(Path(f).is_file() for f in files), files
    assert any(f.endswith(".cu") for f in files) and any(f.endswith("merge.cuh") for f in files)


@pytest.mark.parametrize("field, value", [("model.num_q_heads", True), ("model.num_q_heads", "8"),
                                          ("cache.page_size", 1.0), ("target.arch", 120)])
def test_a_value_of_the_wrong_yaml_type_is_an_error(tmp_path, field, value):
    data = yaml.safe_load(SPEC.read_text())
    section, key = field.split(".")
    data[section][key] = value
    spec = tmp_path / "typed.yaml"
    spec.write_text(yaml.safe_dump(data))
    r = kgen_cli("build", spec, "--out", tmp_path)
    assert r.returncode == 1 and field in r.stderr, r.stderr
