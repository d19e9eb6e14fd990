"""Shared fixtures.

- `seed`: a fresh random seed per test, derived from one session seed that the report header
  prints; rerun with KGEN_TEST_SEED=<that seed> to reproduce a failure.
- `cuda`: skips the test, with the reason, where torch sees no CUDA GPU.
- `module_for(name)`: kgen.jit of a shipped spec (specs/<name>.yaml) or of a derived one
  (DERIVED_SPECS), compiled once per session, with the GPU's own plan, or the plan of the arch
  in KGEN_TEST_PLAN_ARCH (e.g. sm_120: run the suite once more with the sm_120 plan on an H200).
- The kernel cache: KGEN_CACHE_DIR where the environment sets it (CI, a shared cache), else a
  temporary directory for the session; the session fails if the user's ~/.cache/kgen changed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import pytest
import torch
import yaml

import kgen
from kgen import designs
from kgen.spec import parse_spec
from kgen.inputs import fresh_seed

HOME_CACHE = Path.home() / ".cache" / "kgen"
OWN_CACHE = None if os.environ.get("KGEN_CACHE_DIR") else tempfile.mkdtemp(prefix="kgen-test-cache-")
if OWN_CACHE:  # set before any test (or the subprocesses tests start) reads it
    os.environ["KGEN_CACHE_DIR"] = OWN_CACHE


def home_cache_state() -> list | None:
    """What ~/.cache/kgen holds (paths, sizes, mtimes), or None if it does not exist."""
    if not HOME_CACHE.exists():
        return None
    return sorted((str(p.relative_to(HOME_CACHE)), p.lstat().st_size, p.lstat().st_mtime_ns)
                  for p in HOME_CACHE.rglob("*"))


HOME_CACHE_BEFORE = home_cache_state()


def pytest_sessionfinish(session, exitstatus):
    if OWN_CACHE:
        shutil.rmtree(OWN_CACHE, ignore_errors=True)
    told = Path(os.environ["KGEN_CACHE_DIR"]).expanduser().resolve() == HOME_CACHE.resolve()
    if not told and home_cache_state() != HOME_CACHE_BEFORE:
        print(f"\nerror: the test session changed {HOME_CACHE} (tests must use KGEN_CACHE_DIR, never the user's cache)")
        session.exitstatus = 1


SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"
SESSION_SEED = int(os.environ.get("KGEN_TEST_SEED") or fresh_seed())
PLAN_ARCH = os.environ.get("KGEN_TEST_PLAN_ARCH") or None
# KGEN_TEST_CLUSTER=N: the plans' mma.sync tilings in clusters of N CTAs (other loops run as planned).
CLUSTER = int(os.environ.get("KGEN_TEST_CLUSTER") or 1)

# Specs the tests need that are not shipped: name -> (shipped base, cache fields to override).
# glm5_dsa_e4m3_sm120: the DSA pool's fp8 rows with e4m3 MMAs; glm5_dsa_bf16_sm120: sparse verify over
# the DSA pool's bf16 rows. (glm5_p64_sm120, bf16 rows at page size 64, is shipped.)
DERIVED_SPECS = {"glm5_p16_sm120": ("glm5_sm120", {"page_size": 16}),
                 "glm5_fp8_p64_sm120": ("glm5_fp8_sm120", {"page_size": 64}),
                 "glm5_dsa_e4m3_sm120": ("glm5_dsa_fp8_sm120", {"mma": "e4m3"}),
                 "glm5_dsa_bf16_sm120": ("glm5_dsa_sm120", {"kv_dtype": "bfloat16", "scales": None})}


def spec_named(name: str) -> kgen.Spec:
    if name not in DERIVED_SPECS:
        return kgen.load_spec(SPEC_DIR / f"{name}.yaml")
    base, cache = DERIVED_SPECS[name]
    data = yaml.safe_load((SPEC_DIR / f"{base}.yaml").read_text())
    data["name"] = name
    data["cache"].update(cache)
    return parse_spec(data, f"{base}.yaml with {cache}")


def pytest_report_header(config):
    plans = f"the plan of {PLAN_ARCH}" if PLAN_ARCH else "the GPU's own plan"
    plans += f", mma.sync tilings in clusters of {CLUSTER}" if CLUSTER > 1 else ""
    return f"kgen test seed: {SESSION_SEED} (reproduce with KGEN_TEST_SEED={SESSION_SEED}); GPU tests run {plans}"


def clustered_tiles(spec: kgen.Spec):
    """The tiling KGEN_TEST_CLUSTER forces for `spec` (None: the plan's own)."""
    if CLUSTER == 1:
        return None
    from kgen.arch import get_arch
    from kgen.designs.mma_sync import MmaSyncTiles
    arch = PLAN_ARCH or "sm_%d%d" % torch.cuda.get_device_capability()
    tiles = designs.choose(spec, get_arch(arch))
    return dataclasses.replace(tiles, cluster=CLUSTER) if isinstance(tiles, MmaSyncTiles) else None


@pytest.fixture
def seed(request) -> int:
    return (SESSION_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**63


@pytest.fixture(scope="session")
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="session")
def module_for(cuda):
    modules = {}

    def get(name: str):
        if name not in modules:
            spec = spec_named(name)
            modules[name] = kgen.jit(spec, arch=PLAN_ARCH, tiles=clustered_tiles(spec))
        return modules[name]

    return get
