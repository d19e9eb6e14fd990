"""The kgen command line: build, show, cache here; inspect, bench, tune in kgen/cli_tools.py.

Every user error (a spec, a path, a flag, the environment) is one line on stderr and a non-zero
exit, never a traceback: commands raise KgenError, and main() turns those and click's usage errors
into that line. Tables come from kgen/report.py and fit 80 columns.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import List, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from . import cli_tools, designs, report
from .build import build
from .cache import KernelCache
from .cli_io import console, err_console, fail, say, writable_dir
from .errors import KgenError
from .model import grid, modeled, predict, validation
from .plan import plan
from .tuning import buckets, find_table
from .render import write_generated
from .spec import load_spec
from .version import __version__

DISTRIBUTION = "kgen-mla"  # pyproject.toml's [project] name: "kgen" on the package index is another project

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
cache_app = typer.Typer(no_args_is_help=True, help="Inspect or clear the cubin cache.")
app.add_typer(cache_app, name="cache")
UsageError = typer.BadParameter.__base__  # click's UsageError (typer >= 0.20 vendors click, older re-exports it)


def _warn(message, category, filename, lineno, file=None, line=None) -> None:
    say("warning", "yellow", str(message))


def main() -> None:
    """The `kgen` command: the typer app, with every user error as one line (exit 1; usage errors 2)."""
    warnings.showwarning = _warn
    try:
        code = app(standalone_mode=False)
    except UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # the help is printed already
            code = 2
        else:
            cmd = e.ctx.command_path if e.ctx else "kgen"
            say("error", "red", f"{e.format_message()} ({cmd} --help lists what is allowed)")
            code = e.exit_code
    except typer.Abort:
        code = 130
    except KgenError as e:  # outside a command's own handling: a KGEN_* value, an option's callback
        say("error", "red", str(e).splitlines()[0] if str(e) else type(e).__name__)
        code = 1
    sys.exit(code or 0)


def _print_version(value: bool) -> None:
    if value:
        print(f"kgen {__version__} (distribution {DISTRIBUTION})")
        raise typer.Exit()


@app.callback()
def app_main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print kgen's version and distribution name, and exit.")) -> None:
    """Generate, compile and cache kgen kernels."""


@app.command("build")
def build_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    arch: Optional[List[str]] = typer.Option(None, "--arch", help="plan and compile for this arch (repeatable); default: the spec's target"),
    out: Path = typer.Option(Path("generated"), "--out", help="where generated/<name>/ (the target plan's sources) is written"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON instead of a table"),
    wide: bool = typer.Option(False, "--wide", help="also the variant id, occupancy limit, SASS counts and seconds"),
) -> None:
    """Plan, render and compile every kernel of SPEC for each arch (each arch with its own plan);
    write the target plan's sources and a manifest under --out."""
    start = time.perf_counter()
    try:
        spec = load_spec(spec_path)
        archs = list(dict.fromkeys(arch or [spec.target.arch]))  # an arch given twice is built once
        plans = [plan(spec, a) for a in archs]
        target = plan(spec)
        try:
            written = write_generated(target, writable_dir(out))
        except OSError as e:
            raise KgenError(f"--out {out}: cannot write {e.filename} ({e.strerror}); give a directory kgen may "
                            f"create and write") from None
        cache = KernelCache()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=err_console, transient=True, disable=as_json or not sys.stderr.isatty()) as bar:
            task = bar.add_task(f"building {spec.name}", total=sum(len(p.variants) for p in plans))
            built = [b for p in plans
                     for b in build(p, [p.arch.name], cache, on_done=lambda b: bar.advance(task), inspect=True)]
    except KgenError as e:
        fail(e)
    rows = [b.row() for b in built]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    designs = ", ".join(f"{p.arch.name} ({p.tiles.design})" for p in plans)
    console.print(f"{spec.name}: {len(rows)} kernels for {designs} in {time.perf_counter() - start:.2f} s; "
                  f"the sources of the {target.arch.name} plan (the spec's target) are in {written}",
                  markup=False)
    report.print_build(console, err_console, rows, wide)
    for b in built:
        for msg in b.problems():
            say("warning", "yellow", f"{b.variant.name} ({b.arch}): {msg}")


@app.command("show")
def show_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    arch: Optional[str] = typer.Option(None, "--arch", help="whose plan to show (default: the spec's target)"),
    as_json: bool = typer.Option(False, "--json", help="print what the tables show as JSON"),
) -> None:
    """Print ARCH's plan (loop design, tiles, threads, stages, shared memory against the arch limit),
    which tiling each shape bucket runs (a tuned table's choice, or the heuristic plan), each kernel's
    ptxas report, occupancy and SASS counts (built or cached), and the modeled time of ARCH's plan
    over the benchmark grid where the model covers its loop (docs/performance_model.md)."""
    try:
        spec = load_spec(spec_path)
        p = plan(spec, arch)
        a = p.arch
        built = build(p, [a.name], KernelCache(), inspect=True)
        tuned = find_table(spec, a.name)
        times = [predict(spec, shape, a, plan_for=a.name) for shape in grid(spec)] if modeled(p.tiles) else None
    except KgenError as e:
        fail(e)
    out = {"spec": spec.name, "arch": a.name, "design": p.tiles.design, "tiles": designs.text(p.tiles),
           "threads": p.tiles.threads, **p.budget,
           "kernels": report.show_kernel_rows(built),
           "buckets": report.bucket_rows(tuned, buckets()) if tuned else [],
           "model": report.model_rows(times) if times is not None else None,
           "sparse": report.sparse_rows(spec) if spec.model.sparse else None}
    if as_json:
        print(json.dumps(out, indent=2))
        return
    say = lambda text: console.print(text, markup=False)  # noqa: E731
    say(f"{spec.name}: plan for {a.name} ({a.description}); H={spec.model.num_q_heads} D={spec.model.head_dim} "
        f"Dv={spec.model.value_dim} page={spec.cache.page_size} kv={spec.cache.kv_dtype} "
        f"tree={'static ' if spec.tree.is_static else ''}{spec.tree.nodes} nodes")
    say(f"attention: {p.tiles.describe()} ({p.tiles.threads} threads; tiling {designs.text(p.tiles)})")
    say(f"shared memory: {p.budget['attention_smem']} B of {a.smem_per_block} B per block "
        f"({p.budget['attention_smem_headroom']} B headroom)")
    console.print()
    report.print_show_kernels(console, out["kernels"])
    console.print()
    source = (f"tuned table {tuned.path} ({tuned.device})" if tuned else
              f"no tuned table for this spec, {a.name} and kgen {__version__}: every bucket runs the heuristic "
              f"plan (kgen tune writes one)")
    report.print_buckets(console, out["buckets"], source)
    console.print()
    if spec.model.sparse:
        _print_sparse(spec, p, out["sparse"])
    if times is None:
        say(f"modeled time: none for this plan. The performance model (kgen/model.py) covers the "
            f"{', '.join(d.name for d in designs.DESIGNS if d.modeled)} loop and {a.name}'s plan runs the "
            f"{p.tiles.design} loop: kgen bench measures it on the GPU (kgen show SPEC --arch sm_120 models the "
            f"sm_120 plan)")
        return
    say(f"MODEL, not a measurement: {a.name} time of the {a.name} plan from the SASS of the tile loop and the "
        f"arch's rates ({a.sm_count} SMs at {a.clock_ghz} GHz, {a.dram_gbps:.0f} GB/s), per-call terms fitted on "
        f"the H200 (kgen/model.py); {validation()}. Floor = max(bytes / {a.dram_gbps:.0f} GB/s, FLOPs / the MMA "
        f"rate), FLOPs = 2·ΣT·H·(L+T)·(D+Dv); page size {spec.cache.page_size}.")
    report.print_model(console, out["model"])


def _print_sparse(spec, p, rows: list[dict]) -> None:
    """A sparse spec's kernels (their tiling and hash set) and the modeled sm_120 time of its shapes."""
    v = p.variant("sparse_verify_attn")
    config = v.constants["CONFIG"].splitlines()[-1].removeprefix("using Cfg = ").rstrip(";")
    console.print(f"sparse (DSA) verify, index_topk {spec.model.index_topk}: sparse_verify_attn (each row tile's union "
                  f"of its tokens' lists) and sparse_gather_attn (per-token gather), {config}, {v.smem_bytes} B "
                  f"shared memory, a {v.constants['TABLE']}-entry hash set in the KV ring. MODEL, not a measurement: "
                  f"sm_120 time of the sparse schedule's items on the sparse kernels' loop (kgen/sparse_model.py; "
                  f"its terms traced, measured or fitted on H100 runs of both plans, docs/performance_model.md), "
                  f"of the kernel a step picks by size, "
                  f"lists sharing `shared` of K per request; floor = union rows once (DESIGN §12).", markup=False)
    report.print_sparse(console, rows)
    console.print()


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is and what it holds."""
    try:
        info = KernelCache().info()
    except KgenError as e:
        fail(e)
    console.print(f"{info['root']}: {info['entries']} entries, {report.human_bytes(info['bytes'])} "
                  f"({info['bytes']} bytes; schema v{info['schema']})", markup=False)


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every cached kernel (safe while builds run: it waits for their writes)."""
    try:
        n = KernelCache().clear()
    except KgenError as e:
        fail(e)
    console.print(f"removed {n} entries")



app.command("inspect")(cli_tools.inspect_cmd)
app.command("bench")(cli_tools.bench_cmd)
app.command("tune")(cli_tools.tune_cmd)


if __name__ == "__main__":  # python -m kgen.cli works as python -m kgen does
    main()
