"""The content-addressed cubin cache: hits, misses, damage, env switches, concurrent builders."""

import json
import os
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

import kgen
from kgen.build import build, build_variant
from kgen.cache import KernelCache, cache_key
from kgen.errors import CacheError, CacheMissError, CacheWarning
from kgen.plan import plan

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "glm5_sm120.yaml"


@pytest.fixture
def variant():
    return plan(kgen.load_spec(SPEC)).variant("lse_merge_f32")


def test_second_build_hits(tmp_path, variant):
    cache = KernelCache(tmp_path)
    first = build_variant(variant, "sm_120", cache)
    second = build_variant(variant, "sm_120", cache)
    assert (first.status, second.status) == ("compiled", "cached")
    assert first.cubin == second.cubin and first.report == second.report


@pytest.mark.parametrize("damage", ["truncate_cubin", "garbage_meta", "drop_meta", "flip_byte"])
def test_damaged_entry_is_detected_and_rebuilt(tmp_path, variant, damage):
    cache = KernelCache(tmp_path)
    good = build_variant(variant, "sm_120", cache)
    entry = next(p for p in (tmp_path / "v1").glob("*/*") if p.is_dir())
    cubin = entry / "kernel.cubin"
    if damage == "truncate_cubin":
        cubin.write_bytes(cubin.read_bytes()[: len(good.cubin) // 2])
    elif damage == "garbage_meta":
        (entry / "meta.json").write_text("{not json")
    elif damage == "drop_meta":
        (entry / "meta.json").unlink()
    else:
        data = bytearray(cubin.read_bytes())
        data[len(data) // 2] ^= 0xFF
        cubin.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="was damaged"):
        again = build_variant(variant, "sm_120", cache)
    assert again.status == "compiled" and again.cubin == good.cubin
    assert build_variant(variant, "sm_120", cache).status == "cached"


def test_disable_jit_turns_a_miss_into_an_error(tmp_path, variant, monkeypatch):
    cache = KernelCache(tmp_path)
    monkeypatch.setenv("KGEN_DISABLE_JIT", "1")
    with pytest.raises(CacheMissError, match="KGEN_DISABLE_JIT=1"):
        build_variant(variant, "sm_120", cache)
    monkeypatch.delenv("KGEN_DISABLE_JIT")
    build_variant(variant, "sm_120", cache)
    monkeypatch.setenv("KGEN_DISABLE_JIT", "1")
    assert build_variant(variant, "sm_120", cache).status == "cached"


def test_always_compile_rebuilds(tmp_path, variant, monkeypatch):
    cache = KernelCache(tmp_path)
    build_variant(variant, "sm_120", cache)
    monkeypatch.setenv("KGEN_ALWAYS_COMPILE", "1")
    assert build_variant(variant, "sm_120", cache).status == "compiled"
    assert len([p for p in (tmp_path / "v1").glob("*/*") if p.is_dir()]) == 1


def test_key_covers_every_input():
    base = dict(source="s", headers={"kgen/a.cuh": "x"}, nvrtc_version="13.0", options=["-O3"], arch="sm_120")
    keys = {cache_key(**base)}
    for change in ({"source": "t"}, {"headers": {"kgen/a.cuh": "y"}}, {"headers": {"kgen/b.cuh": "x"}},
                   {"nvrtc_version": "13.1"}, {"options": ["-O2"]}, {"arch": "sm_90"}):
        keys.add(cache_key(**{**base, **change}))
    assert len(keys) == 7


def test_info_and_clear(tmp_path, variant):
    cache = KernelCache(tmp_path)
    build_variant(variant, "sm_120", cache)
    build_variant(variant, "sm_90", cache)
    assert cache.info()["entries"] == 2
    assert cache.clear() == 2 and cache.info()["entries"] == 0


def _kgen(args, cache_dir, out_dir):
    env = {**os.environ, "KGEN_CACHE_DIR": str(cache_dir)}
    return subprocess.Popen([sys.executable, "-m", "kgen", "build", str(SPEC), "--json", "--out", str(out_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_eight_processes_compile_each_variant_once(tmp_path):
    procs = [_kgen([], tmp_path / "cache", tmp_path / f"gen{i}") for i in range(8)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    rows = [row for out, _ in outs for row in json.loads(out)]
    compiled = Counter(r["variant_id"] for r in rows if r["status"] == "compiled")
    variants = {r["variant_id"] for r in rows}
    assert len(rows) == 8 * len(variants)
    assert compiled == Counter({v: 1 for v in variants}), compiled


def test_cached_build_is_fast_and_all_cached(tmp_path):
    first = _kgen([], tmp_path / "cache", tmp_path / "gen")
    first.communicate(timeout=600)
    start = time.perf_counter()
    second = _kgen([], tmp_path / "cache", tmp_path / "gen")
    out, err = second.communicate(timeout=600)
    elapsed = time.perf_counter() - start
    assert second.returncode == 0, err
    assert {r["status"] for r in json.loads(out)} == {"cached"}
    assert elapsed < 2.0, f"cached build took {elapsed:.2f} s"


def test_build_does_not_import_torch(tmp_path):
    """Importing torch alone takes over a second on a CI core: planning, rendering and compiling
    must not need it, so `kgen build` stays fast and runs where torch is broken."""
    probe = ("import atexit, runpy, sys; atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); "
             f"sys.argv = ['kgen', 'build', {str(SPEC)!r}, '--json', '--out', {str(tmp_path / 'gen')!r}]; "
             "runpy.run_module('kgen', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KGEN_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "False", "kgen build imported torch"


def test_build_writes_sources_and_manifest(tmp_path):
    p = plan(kgen.load_spec(SPEC))
    proc = _kgen([], tmp_path / "cache", tmp_path / "gen")
    proc.communicate(timeout=600)
    manifest = json.loads((tmp_path / "gen" / p.spec.name / "manifest.json").read_text())
    assert [v["variant_id"] for v in manifest["variants"]] == [v.variant_id for v in p.variants]
    assert build(p, ["sm_120"], KernelCache(tmp_path / "cache"))[0].status == "cached"


def test_a_repaired_entry_warns_once_naming_it(tmp_path, variant):
    cache = KernelCache(tmp_path)
    build_variant(variant, "sm_120", cache)
    entry = next(p for p in (tmp_path / "v1").glob("*/*") if p.is_dir())
    (entry / "meta.json").write_text("{not json")
    with pytest.warns(CacheWarning) as caught:
        assert build_variant(variant, "sm_120", cache).status == "compiled"
        assert build_variant(variant, "sm_120", cache).status == "cached"
    assert len(caught) == 1 and str(entry) in str(caught[0].message)


def test_an_entry_landing_during_a_lookup_is_read_not_removed(tmp_path, variant, monkeypatch):
    """A process that misses just as another one's entry lands finds no meta.json, then the entry's
    directory: that is a race, not damage. Judged as damage, the good entry was removed and compiled
    again (once in ~40 runs of the eight-process test)."""
    cache = KernelCache(tmp_path)
    good = build_variant(variant, "sm_120", cache)
    entry = next(p for p in (tmp_path / "v1").glob("*/*") if p.is_dir())
    read_text, late = Path.read_text, []

    def meta_not_there_yet(path, *args, **kwargs):
        if path.name == "meta.json" and not late:
            late.append(path)
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", meta_not_there_yet)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        found = cache.lookup(entry.name)
    assert late == [entry / "meta.json"] and found is not None and found.cubin == good.cubin
    assert (entry / "meta.json").exists()


def test_a_cache_dir_that_is_a_file_is_one_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(SPEC))
    with pytest.raises(CacheError, match=f"KGEN_CACHE_DIR={SPEC} is not a directory"):
        KernelCache()


def test_the_suite_never_uses_the_users_cache():
    from conftest import HOME_CACHE, OWN_CACHE

    from kgen.env import cache_root

    # without an explicit KGEN_CACHE_DIR the session made its own; an explicit one is the caller's choice
    assert cache_root() == Path(OWN_CACHE or os.environ["KGEN_CACHE_DIR"]).expanduser()
    assert OWN_CACHE is None or not Path(OWN_CACHE).is_relative_to(HOME_CACHE)


def test_clear_racing_four_builds_breaks_none_and_leaves_a_whole_cache(tmp_path):
    cache_dir = tmp_path / "cache"
    procs = [_kgen([], cache_dir, tmp_path / f"gen{i}") for i in range(4)]
    clears = 0
    while any(p.poll() is None for p in procs):
        for command in ("clear", "info"):  # info counts entries that clear removes under it
            r = subprocess.run([sys.executable, "-m", "kgen", "cache", command], capture_output=True, text=True,
                               env={**os.environ, "KGEN_CACHE_DIR": str(cache_dir)}, timeout=600)
            assert r.returncode == 0, r.stderr
        clears += 1
    outs = [p.communicate() for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert "Traceback" not in err, err
        assert p.returncode == 0 or len(err.strip().splitlines()) == 1, err
    assert clears >= 2 and sum(p.returncode == 0 for p in procs) >= 1
    cache = KernelCache(cache_dir)
    keys = [p.name for p in (cache_dir / "v1").glob("*/*")] if (cache_dir / "v1").exists() else []
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # intact: no entry needs repair
        assert all(cache.lookup(k) is not None for k in keys)
    assert not [p for p in (cache_dir / "tmp").glob("*")] if (cache_dir / "tmp").exists() else True
    after = _kgen([], cache_dir, tmp_path / "gen_after")
    out, err = after.communicate(timeout=600)
    assert after.returncode == 0 and "warning" not in err, err
