"""The command line as a user meets it: the build table at 80 columns, errors printed as written,
--version, `kgen show` independent of the working directory, line info naming files that exist.
Each command runs as `python -m kgen` in a fresh process, as a user would run it."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import yaml

import kgen
from kgen import sass
from kgen.model import grid

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "glm5_sm120.yaml"
DSA_SPEC = ROOT / "specs" / "glm5_dsa_sm120.yaml"  # the longest variant ids: sparse kernels, page 64, DSA rows
KERNELS = ("prefix_attn", "tree_attn", "verify_attn", "lse_merge_bf16", "lse_merge_f32", "lse_combine", "kv_defrag",
           "split_schedule")


def kgen_cli(*args, cwd=None, columns: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "kgen", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_version():
    r = kgen_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kgen {kgen.__version__} (distribution kgen-mla)"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'name = "kgen-mla"' in pyproject


def test_the_build_table_at_80_columns_shows_every_kernels_name_status_and_spills(tmp_path):
    r = kgen_cli("build", SPEC, "--arch", "sm_120", "--arch", "sm_90", "--out", tmp_path, columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert "for sm_120 (mma_sync), sm_90 (seesaw)" in r.stdout  # the title names every arch built, with its loop
    rows = [line.split() for line in lines if line.split() and line.split()[0] in KERNELS]
    assert sorted((row[0], row[1]) for row in rows) == sorted((k, a) for k in KERNELS for a in ("sm_120", "sm_90"))
    header = next(line.split() for line in lines if line.split()[:2] == ["kernel", "arch"])
    for row in rows:
        cells = dict(zip(header, row))
        assert cells["status"] in ("compiled", "cached") and cells["spill"].isdigit()


def test_wide_adds_the_variant_id_and_sass_where_the_terminal_is_wide(tmp_path):
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
    modeled = json.loads(kgen_cli("show", SPEC, "--json").stdout)["model"]
    # one row of the modeled table per shape of the benchmark grid, in its order (H, T, L, B, page)
    assert [[r[k] for k in ("H", "T", "L", "B", "page")] for r in modeled] == \
        [[s.H, s.T, s.L, s.B, s.page_size] for s in grid(kgen.load_spec(SPEC))]


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


# ---- every user error is one line, no traceback, non-zero exit ----

def _spec_with(tmp_path, text: str | bytes) -> Path:
    path = tmp_path / "user.yaml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


BAD_SPECS = {
    "binary": (b"\xff\xfe\x00\x01kgen", "not UTF-8"),
    "nul byte": (b"name: a\x00\n", "not valid YAML"),
    "duplicate key": (SPEC.read_text().replace("name: glm5_sm120", "name: glm5_sm120\nname: other"), "given twice"),
    "over-budget dim": (SPEC.read_text().replace("kv_lora_rank: 512", "kv_lora_rank: 576"), "model.kv_lora_rank"),
}


def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


COMMANDS = {"build": ["build"], "show": ["show"], "inspect": ["inspect", None, "prefix_attn"],
            "tune": ["tune", None, "--arch", "sm_120"], "bench": ["bench"]}


# (bench plans per shape on the GPU: an over-budget dim for sm_120 would benchmark on an H200)
@pytest.mark.parametrize("command, bad", [(c, b) for c in COMMANDS for b in BAD_SPECS
                                          if (c, b) != ("bench", "over-budget dim")])
def test_a_bad_spec_is_one_line_from_every_command(tmp_path, command, bad):
    text, needle = BAD_SPECS[bad]
    spec = _spec_with(tmp_path, text)
    args = [spec if a is None else a for a in COMMANDS[command]]
    args = args if None in COMMANDS[command] else [*args, spec]
    _one_line_error(kgen_cli(*args, "--out", tmp_path / "out") if command == "build" else kgen_cli(*args), needle)


@pytest.mark.parametrize("kind", ["a file", "not creatable", "not writable"])
@pytest.mark.parametrize("command", ["build", "bench"])
def test_a_bad_out_is_one_line_naming_it(tmp_path, kind, command):
    if kind == "a file":
        out = SPEC
    elif kind == "not creatable":
        out = Path("/proc/kgen-nope")
    elif os.geteuid() == 0:
        out = Path("/sys")  # root writes anywhere but here
    else:
        out = tmp_path / "ro"
        out.mkdir(mode=0o555)
    _one_line_error(kgen_cli(command, SPEC, "--out", out), f"--out {out}")


def _kgen_with_cache(cache_dir, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kgen", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "KGEN_CACHE_DIR": str(cache_dir)}, timeout=600)


@pytest.mark.parametrize("command", [["build", SPEC], ["show", SPEC], ["inspect", SPEC, "lse_combine"],
                                     ["cache", "info"], ["cache", "clear"]])
@pytest.mark.parametrize("where, needle", [(SPEC, "is not a directory"), (SPEC / "x", f"is inside {SPEC}, a file")])
def test_a_cache_dir_that_is_a_file_is_one_line_from_every_command(tmp_path, command, where, needle):
    extra = ["--out", tmp_path] if command[0] == "build" else []
    _one_line_error(_kgen_with_cache(where, *command, *extra), f"KGEN_CACHE_DIR={where} {needle}")


def test_an_unwritable_cache_dir_is_one_line(tmp_path):
    if os.geteuid() == 0:
        where = Path("/sys/kgen-cache")  # root writes anywhere but here
    else:
        (tmp_path / "ro").mkdir(mode=0o555)
        where = tmp_path / "ro" / "cache"
    _one_line_error(_kgen_with_cache(where, "build", SPEC, "--out", tmp_path), f"KGEN_CACHE_DIR={where}: cannot write")


@pytest.mark.parametrize("args, needle", [(["tune", SPEC, "--budget-s", "-5"], "--budget-s"),
                                          (["tune", SPEC, "--buckets", "decode,deocde"], "starts with 'deocde'"),
                                          (["tune", SPEC, "--buckets", "decode", "--arch", "sm_120"], "give one of the two"),
                                          (["bench", SPEC, "--heads", "8,x"], "--heads"),
                                          (["build", SPEC, "--arch", "sm_80"], "known: sm_120, sm_90"),
                                          (["build", SPEC, "--bogus"], "--bogus"),
                                          (["build"], "SPEC")])
def test_bad_flags_are_one_line(args, needle):
    _one_line_error(kgen_cli(*args), needle)


def test_a_cache_miss_under_disable_jit_names_the_kernel_and_spec(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KGEN_CACHE_DIR": str(tmp_path / "empty"), "KGEN_DISABLE_JIT": "1"}
    r = subprocess.run([sys.executable, "-m", "kgen", "build", str(SPEC), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=env)
    _one_line_error(r, "spec glm5_sm120", "kernel lse_merge_bf16", "for sm_120", "KGEN_DISABLE_JIT")


def test_a_repeated_arch_is_built_once_and_the_sources_are_named(tmp_path):
    r = kgen_cli("build", SPEC, "--arch", "sm_90", "--arch", "sm_90", "--out", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    assert [row["arch"] for row in json.loads(r.stdout)] == ["sm_90"] * len(KERNELS)
    r = kgen_cli("build", SPEC, "--arch", "sm_90", "--out", tmp_path)
    assert (f"the sources of the sm_120 plan (the spec's target) are in {tmp_path / 'glm5_sm120'}"
            in " ".join(r.stdout.split()))


def test_cache_info_prints_a_readable_size(tmp_path):
    r = kgen_cli("cache", "info")
    assert r.returncode == 0 and re.search(r"entries, \d+(\.\d)? (B|kB|MB|GB) \(\d+ bytes", r.stdout), r.stdout


# ---- every table at 80 columns, through a terminal, holds every number of the JSON whole ----

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(*args, columns: int = 80) -> str:
    """What `kgen ARGS` shows on a terminal `columns` wide (a pseudo-terminal), without colours."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen([sys.executable, "-m", "kgen", *map(str, args)], stdin=slave, stdout=slave,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=600) == 0
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def _assert_whole(screen: str, values) -> None:
    assert "…" not in screen, screen
    assert max(map(len, screen.splitlines())) <= 80, screen
    for v in values:
        text = str(v)
        assert re.search(rf"(?<![\w.]){re.escape(text)}(?![\w.])", screen), f"{text!r} is not on screen:\n{screen}"


def _numbers_and_names(obj, skip=("seconds", "status")):
    """Every number and name (str) in a JSON value, leaving out `skip` keys (they differ between runs)."""
    if isinstance(obj, dict):
        return [x for k, v in obj.items() if k not in skip for x in _numbers_and_names(v, skip)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers_and_names(v, skip)]
    return [] if obj is None or isinstance(obj, bool) else [obj]


@pytest.mark.parametrize("wide", [False, True])
def test_build_tables_at_80_columns_hold_every_number(tmp_path, wide):
    args = ["build", SPEC, "--arch", "sm_120", "--arch", "sm_90", "--out", tmp_path]
    rows = json.loads(kgen_cli(*args, "--json").stdout)
    screen = on_terminal(*args, *(["--wide"] if wide else []))
    shown = ("kernel", "arch", "registers", "spill_bytes", "smem_bytes", "cubin_bytes")
    values = [v for r in rows for v in ([r[k] for k in shown] + [r["occupancy"]["ctas_per_sm"]])]
    if wide:
        values += [v for r in rows for v in (r["variant_id"], r["limit"])]
        values += [pair for r in rows for pair in re.findall(r"\S+ \S+", sass.summary(r["sass"]))]
    _assert_whole(screen, values)


@pytest.mark.parametrize("spec, arch", [(SPEC, "sm_120"), (SPEC, "sm_90"), (DSA_SPEC, "sm_120")])
def test_show_at_80_columns_holds_every_number_of_its_json(spec, arch):
    data = json.loads(kgen_cli("show", spec, "--arch", arch, "--json").stdout)
    screen = on_terminal("show", spec, "--arch", arch)
    sparse = [{**r, "shared": f"{r['shared']:.0%}"} for r in data.get("sparse") or []]  # printed as a percentage
    values = _numbers_and_names({**{k: v for k, v in data.items() if k != "kernels"}, "sparse": sparse})
    values += [v for r in data["kernels"] for k, v in r.items() if k != "sass"]
    values += [pair for r in data["kernels"] for pair in re.findall(r"\S+ \S+", r["sass"])]
    _assert_whole(screen, [v for v in values if v != data["design"]])
    assert data["model"] and "MODEL" in screen  # both plans are modeled (sm_90's on its own rates)


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
def test_tune_ranking_at_80_columns_ranks_every_design_and_marks_the_plan(arch):
    data = json.loads(kgen_cli("tune", SPEC, "--arch", arch, "--json").stdout)
    screen = on_terminal("tune", SPEC, "--arch", arch)
    rows = data["rows"]
    _assert_whole(screen, [v for r in rows for v in (r["tiling"], r["modeled_us"], r["buckets_won"]) if v is not None])
    assert sum(r["current"] for r in rows) == 1 and "current" in screen and "tiling: mma_sync:BM,BN" in screen
    assert [r["rank"] for r in rows] == sorted(r["rank"] for r in rows)
    if arch == "sm_90":
        assert {"wgmma", "mma_sync", "overlap", "seesaw"} == {r["tiling"].split(":")[0] for r in rows}
        current = next(r for r in rows if r["current"])
        assert current["tiling"].startswith("seesaw") and current["modeled_us"] is not None
    for r in rows:
        assert r["tied"] == (sum(o["rank"] == r["rank"] for o in rows) > 1)
