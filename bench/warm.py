"""Build on this (CPU) machine the cubins a GPU run will load, and copy their cache entries into a
folder to carry to the GPU machine (the device tool's `carry`), so the run compiles nothing it can
load. NVRTC's output is the same on either machine: the cache key holds the NVRTC version.

    python -m bench.warm OUT [--arch sm_90] [--group tests|sparse|dsa|dsa_pool|sm90_loops ...] [--jobs N]

Groups: tests — every shipped and derived spec of tests/conftest.py, both plans, each with every
tiling kgen.jit loads on the GPU (tuned tables' choices and their fits to batches: clusters); sparse — the
sparse GPU tests' specs (tests/test_sparse_gpu.py), both plans; dsa — the specs kgen's SGLang DSA
backend derives in tests/test_sglang_dsa_gpu.py; dsa_pool — tests/test_dsa_pool_gpu.py's specs, both
plans, every tiling as in `tests`; sm90_loops — the tilings of the sm_90 loops that
tests/test_attention_gpu.py runs beside the plans (the wgmma loop over fp8 rows, the seesaw loop, the
mma.sync loop over the DSA rows with their scales in V).
Default: sparse, dsa, sm90_loops (the `tests` group is larger than
a carry beside the SGLang wheels). Then run with KGEN_CACHE_DIR=$PWD/OUT on the GPU machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kgen import designs
from kgen.arch import get_arch
from kgen.build import build_variant
from kgen.cache import KernelCache
from kgen.choice import PlanChoice
from kgen.integrations.sglang_dsa import sparse_spec_data
from kgen.plan import plan
from kgen.spec import Spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
GROUPS = ("tests", "sparse", "dsa", "dsa_pool", "sm90_loops")


def dsa_backend_spec(kind: str, nodes: int) -> Spec:
    """The spec KgenDSABackend derives for tests/sglang_dsa_harness.py's runners (GLM-5's MLA, 8
    heads, softmax scale 1/16, page 64), on the H200."""
    cache = dict(kv_dtype="bfloat16") if kind == "bf16" else dict(kv_dtype="float8_e4m3fn", scales="per_block")
    return parse_spec(sparse_spec_data(8, 0.0625, 512, 64, 2048, 64, cache, nodes, "sm_90"), "the SGLang DSA harness")


def jobs(group: str, arch: str = "sm_90") -> list[tuple[Spec, str, object]]:
    """(spec, plan arch, tiles or None) of a group, for a GPU of `arch`."""
    from conftest import DERIVED_SPECS, SPEC_DIR, spec_named

    def every_tiling(names):  # both plans of each spec, with every tiling kgen.jit may load for them
        return [(s, a, t) for s in map(spec_named, names) for a in ("sm_90", "sm_120")
                for t in PlanChoice.find(s, get_arch(a), cubin_arch=get_arch(arch)).tilings()]

    if group == "tests":
        return every_tiling([p.stem for p in sorted(SPEC_DIR.glob("*.yaml"))] + list(DERIVED_SPECS))
    if group == "dsa_pool":
        from test_dsa_pool_gpu import SPECS

        return every_tiling(SPECS)
    if group == "sparse":
        from test_sparse_gpu import SPARSE_SPECS, sparse_spec

        return [(sparse_spec(n), a, None) for n in SPARSE_SPECS for a in ("sm_90", "sm_120")]
    if group == "dsa":
        return [(dsa_backend_spec(k, n), "sm_90", None) for k, n in (("bf16", 4), ("bf16", 16), ("fp8", 16))]
    from test_attention_gpu import SM90_CASES

    return [(spec_named(n), "sm_90", designs.parse(t)) for n, t in SM90_CASES]


def warm(job: tuple[Spec, str, object, str, Path]) -> str:
    """Build every variant of one plan for `arch` (through the cache) and copy the entries to `out`."""
    spec, plan_arch, tiles, arch, out = job
    cache = KernelCache()
    statuses = []
    for v in plan(spec, plan_arch, tiles).variants:
        built = build_variant(v, arch, cache)
        statuses.append(built.status)
        entry = cache.entry_dir(built.key)
        # entries are content-addressed: a job beside this one may copy the same (shared) kernel's
        shutil.copytree(entry, out / entry.relative_to(cache.root), dirs_exist_ok=True)
    return f"{spec.name} ({plan_arch} plan{', ' + designs.text(tiles) if tiles else ''}): " + \
        ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warm", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--arch", default="sm_90", help="the GPU machine's arch (default sm_90: the H200)")
    p.add_argument("--group", action="append", choices=GROUPS, help="repeatable; default: sparse, dsa, sm90_loops")
    p.add_argument("--jobs", type=int, default=2, help="compiling processes (default 2: this machine's cores)")
    args = p.parse_args(argv)
    work = [(*j, args.arch, args.out) for g in (args.group or ["sparse", "dsa", "sm90_loops"])
            for j in jobs(g, args.arch)]
    with ProcessPoolExecutor(args.jobs) as pool:
        for line in pool.map(warm, work):
            print(line, flush=True)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{args.out}: {size / 2**20:.1f} MiB to carry")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
