"""The kgen command line: build, show, inspect, tune, cache, bench.

Every user error (a spec, a path, a flag, the environment) is one line on stderr and a non-zero
exit, never a traceback: commands raise KgenError, and main() turns those and click's usage errors
into that line. Tables come from kgen/cli_tables.py and fit 80 columns.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from . import __version__, cli_tables, sass
from .arch import get_arch, nvrtc_arch
from .build import build, build_variant
from .cache import KernelCache
from .errors import CacheMissError, KgenError
from .model import MODELED_DESIGNS, grid, predict, validation
from .plan import plan
from .tuning import buckets, find_table, tiles_text
from .render import render, templates_dir, write_generated
from .spec import load_spec

DISTRIBUTION = "kgen-mla"  # pyproject.toml's [project] name: "kgen" on the package index is another project

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
cache_app = typer.Typer(no_args_is_help=True, help="Inspect or clear the cubin cache.")
app.add_typer(cache_app, name="cache")
console = Console(highlight=False)  # the terminal's width (COLUMNS; 80 when not a terminal): tables fit 80
err_console = Console(stderr=True, highlight=False)
UsageError = typer.BadParameter.__base__  # click's UsageError (typer >= 0.20 vendors click, older re-exports it)


def _say(kind: str, style: str, message: str) -> None:
    """`kind: message` on stderr; the message is printed as is (no markup)."""
    err_console.print(Text(f"{kind}: ", style=style) + Text(message), soft_wrap=True)


def _fail(e: Exception) -> None:
    first, *detail = str(e).splitlines() or [type(e).__name__]
    _say("error", "red", first)
    if detail:
        err_console.print(Text("\n".join(detail)))
    raise typer.Exit(1)


def _warn(message, category, filename, lineno, file=None, line=None) -> None:
    _say("warning", "yellow", str(message))


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
            _say("error", "red", f"{e.format_message()} ({cmd} --help lists what is allowed)")
            code = e.exit_code
    except typer.Abort:
        code = 130
    except KgenError as e:  # raised outside a command's own handling (e.g. in an option's callback)
        _say("error", "red", str(e).splitlines()[0] if str(e) else type(e).__name__)
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


def _writable_dir(path: Path, option: str = "--out") -> Path:
    """`path` as a directory kgen may write (created if missing), or a one-line error naming `option`."""
    if path.exists() and not path.is_dir():
        raise KgenError(f"{option} {path} is a file; give a directory (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".kgen-write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise KgenError(f"{option} {path}: cannot write there ({e.strerror}); give a directory kgen may create "
                        f"and write") from None
    return path


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
            written = write_generated(target, _writable_dir(out))
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
        _fail(e)
    rows = [b.row() for b in built]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    designs = ", ".join(f"{p.arch.name} ({p.tiles.design})" for p in plans)
    console.print(f"{spec.name}: {len(rows)} kernels for {designs} in {time.perf_counter() - start:.2f} s; "
                  f"the sources of the {target.arch.name} plan (the spec's target) are in {written}",
                  markup=False)
    cli_tables.print_build(console, err_console, rows, wide)
    for b in built:
        for msg in b.problems():
            _say("warning", "yellow", f"{b.variant.name} ({b.arch}): {msg}")


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
        modeled = ([predict(spec, shape, a, plan_for=a.name) for shape in grid(spec)]
                   if p.tiles.design in MODELED_DESIGNS else None)
    except KgenError as e:
        _fail(e)
    out = {"spec": spec.name, "arch": a.name, "design": p.tiles.design, "tiles": tiles_text(p.tiles),
           "threads": p.tiles.threads, **p.budget,
           "kernels": cli_tables.show_kernel_rows(built),
           "buckets": cli_tables.bucket_rows(tuned, buckets()) if tuned else [],
           "model": cli_tables.model_rows(modeled) if modeled is not None else None}
    if as_json:
        print(json.dumps(out, indent=2))
        return
    say = lambda text: console.print(text, markup=False)  # noqa: E731
    say(f"{spec.name}: plan for {a.name} ({a.description}); H={spec.model.num_q_heads} D={spec.model.head_dim} "
        f"Dv={spec.model.value_dim} page={spec.cache.page_size} kv={spec.cache.kv_dtype} "
        f"tree={'static ' if spec.tree.is_static else ''}{spec.tree.nodes} nodes")
    say(f"attention: {p.tiles.describe()} ({p.tiles.threads} threads; tiling {tiles_text(p.tiles)})")
    say(f"shared memory: {p.budget['attention_smem']} B of {a.smem_per_block} B per block "
        f"({p.budget['attention_smem_headroom']} B headroom)")
    console.print()
    cli_tables.print_show_kernels(console, out["kernels"])
    console.print()
    source = (f"tuned table {tuned.path} ({tuned.device})" if tuned else
              f"no tuned table for this spec, {a.name} and kgen {__version__}: every bucket runs the heuristic "
              f"plan (kgen tune writes one)")
    cli_tables.print_buckets(console, out["buckets"], source)
    console.print()
    if modeled is None:
        say(f"modeled time: none for this plan. The performance model (kgen/model.py) covers the "
            f"{', '.join(MODELED_DESIGNS)} loop and {a.name}'s plan runs the {p.tiles.design} loop: kgen bench "
            f"measures it on the GPU (kgen show SPEC --arch sm_120 models the sm_120 plan)")
        return
    say(f"MODEL, not a measurement: {a.name} time of the {a.name} plan from the SASS of the tile loop and the "
        f"arch's rates ({a.sm_count} SMs at {a.clock_ghz} GHz, {a.dram_gbps:.0f} GB/s), per-call terms fitted on "
        f"the H200 (kgen/model.py); {validation()}. Floor = max(bytes / {a.dram_gbps:.0f} GB/s, FLOPs / the MMA "
        f"rate), FLOPs = 2·ΣT·H·(L+T)·(D+Dv); page size {spec.cache.page_size}.")
    cli_tables.print_model(console, out["model"])


@app.command("inspect")
def inspect_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    kernel: str = typer.Argument(..., metavar="KERNEL", help="variant name (e.g. prefix_attn, lse_merge_bf16) or kernel kind"),
    arch: Optional[str] = typer.Option(None, "--arch", help="the arch whose cubin to disassemble; default: the spec's target"),
    line_info: bool = typer.Option(False, "--line-info", help="annotate with source lines"),
) -> None:
    """Dump the SASS of one kernel of SPEC (compiled or loaded from the cache) with nvdisasm."""
    try:
        spec = load_spec(spec_path)
        a = get_arch(arch or spec.target.arch)
        p = plan(spec, a)
        variants = [v for v in p.variants if kernel in (v.name, v.kernel)]
        if not variants:
            raise KgenError(f"{spec.name} has no kernel {kernel!r}; kernels: {', '.join(v.name for v in p.variants)}")
        cache = KernelCache()
        for v in variants:
            try:
                b = build_variant(v, a.name, cache, inspect=True)
            except CacheMissError as e:
                raise CacheMissError(f"spec {spec.name}: {e}") from None
            print(f"// {v.variant_id} for {a.name}: {b.report.registers} registers, {b.report.spill_bytes} B spills, "
                  f"{b.occupancy.ctas_per_sm} CTAs/SM (limit: {b.occupancy.limit})\n// {sass.summary(b.sass)}")
            text = sass.dump(b.cubin, nvrtc_arch(a.name, v.requires), line_info=line_info)  # sm_90a for wgmma
            print(_existing_line_paths(text, v, cache) if line_info else text)
    except KgenError as e:
        _fail(e)


_LINE_FILE = re.compile(r'(//## File ")([^"]*)(")')


def _existing_line_paths(text: str, variant, cache: KernelCache) -> str:
    """nvdisasm's line info names the files as NVRTC saw them (`<name>.cu`, `kgen/<header>.cuh`,
    under the directory the kernel was first compiled in): point them at files that exist — the
    rendered source, written next to the cache, and the headers in kgen's templates."""
    source = cache.root / "sources" / f"{variant.variant_id}.cu"
    try:
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(render(variant))
    except OSError as e:
        raise KgenError(f"{cache.described}: cannot write {source} for --line-info ({e.strerror})") from None

    def fix(m: re.Match) -> str:
        name = Path(m.group(2)).name
        if name == f"{variant.name}.cu":
            return f"{m.group(1)}{source}{m.group(3)}"
        if (templates_dir() / name).is_file():
            return f"{m.group(1)}{templates_dir() / name}{m.group(3)}"
        return m.group(0)

    return _LINE_FILE.sub(fix, text)


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is and what it holds."""
    try:
        info = KernelCache().info()
    except KgenError as e:
        _fail(e)
    console.print(f"{info['root']}: {info['entries']} entries, {cli_tables.human_bytes(info['bytes'])} "
                  f"({info['bytes']} bytes; schema v{info['schema']})", markup=False)


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every cached kernel (safe while builds run: it waits for their writes)."""
    try:
        n = KernelCache().clear()
    except KgenError as e:
        _fail(e)
    console.print(f"removed {n} entries")


@app.command("bench")
def bench_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="base spec YAML (heads, tree and page size vary over the grid)"),
    quick: bool = typer.Option(False, "--quick", help="a handful of shapes at the spec's head count (under a minute)"),
    page_size: Optional[int] = typer.Option(None, "--page-size", min=1, help="KV page size (default: the spec's)"),
    heads: str = typer.Option("8,16", "--heads", help="comma-separated head counts of the grid"),
    triton: bool = typer.Option(True, "--triton/--no-triton", help="time SGLang's Triton extend_attention_fwd too"),
    graph: bool = typer.Option(True, "--graph/--no-graph", help="time by CUDA-graph replay (default) or eagerly"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", min=0.0, help="start no new shape after this many seconds"),
    out: Path = typer.Option(Path("bench/results"), "--out", help="where the JSON and PNG are written"),
) -> None:
    """(GPU) Benchmark SPEC: the two ceilings, the benchmark grid (docs/design.md) and SGLang's Triton baseline;
    a table, bench/results/<spec>-<time>.json and a PNG plot. Same as python -m bench.run."""
    # bench/ lives next to the package in a checkout, not inside the wheel
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / "bench" / "run.py").is_file() and str(root) not in sys.path:
            sys.path.insert(0, str(root))
    try:
        load_spec(spec_path)
        head_counts = tuple(int(h) for h in heads.split(",")) if re.fullmatch(r"\d+(,\d+)*", heads) else None
        if not head_counts or not all(head_counts):
            raise KgenError(f"--heads {heads!r}: give comma-separated head counts >= 1, e.g. 8,16")
        _writable_dir(out)
        try:
            from bench.run import BenchError, run
        except ImportError as e:
            raise KgenError(f"kgen bench needs the bench/ folder of a kgen checkout (run it from the repository "
                            f"root): {e}") from None
        try:
            code = run(spec_path, quick=quick, page_size=page_size, heads=head_counts, triton=triton, graph=graph,
                       time_limit=time_limit, out_dir=out)
        except (BenchError, ValueError) as e:
            raise KgenError(str(e)) from None
    except KgenError as e:
        _fail(e)
    raise typer.Exit(code)


@app.command("tune")
def tune_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    budget_s: float = typer.Option(300.0, "--budget-s", min=0.0, help="start no new shape bucket after this many seconds (>= 0)"),
    arch: Optional[str] = typer.Option(None, "--arch", help="an arch other than the GPU present: rank its candidate "
                                                           "tilings by the performance model (no GPU needed)"),
    out: Optional[Path] = typer.Option(None, "--out", help="table file (default: the user table under KGEN_CACHE_DIR/tuned)"),
    as_json: bool = typer.Option(False, "--json", help="with --arch: print the ranking as JSON"),
) -> None:
    """(GPU) Time the candidate attention tilings of SPEC per shape bucket on the GPU present and write
    the winners to a tuned table, which kgen.jit then uses for that spec, arch and kgen version.
    With --arch for an arch that is not present, rank the candidates by the model instead."""
    from .tuning import table_name, user_dir

    try:
        spec = load_spec(spec_path)
        if out is not None and out.is_dir():
            raise KgenError(f"--out {out} is a directory; give the table's file name (e.g. {out / 'table.json'})")
        import torch

        here = None
        if torch.cuda.is_available():
            from .arch import arch_for_capability

            here = arch_for_capability(*torch.cuda.get_device_capability()).name
        if arch and arch != here:
            _rank_by_model(spec, get_arch(arch), as_json)
            return
        if here is None:
            raise KgenError("kgen tune times on the GPU present, and torch sees none here "
                            "(--arch ARCH ranks an arch's tilings by the performance model instead)")
        if out is not None:
            _writable_dir(out.parent, "--out's folder")
        from .tuner import tune

        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err_console) as bar:
            task = bar.add_task(f"tuning {spec.name}", total=len(buckets()))

            def done(bucket, r):
                bar.advance(task)
                bar.console.print(f"{bucket.key:20s} " + "  ".join(f"{t} {us:.1f}" for t, us in sorted(r["times"].items()))
                                  + f"  noise {100 * r['noise']:.1f}% -> {r['chosen']}", highlight=False, markup=False)

            table = tune(spec, budget_s, on_bucket=done)
        path = out or user_dir() / table_name(spec, table.arch)
        try:
            table.save(path)
        except OSError as e:
            raise KgenError(f"cannot write the tuned table {path} ({e.strerror}); give --out a file kgen may "
                            f"write") from None
    except KgenError as e:
        _fail(e)
    console.print(f"{len(table.choices)} buckets tuned for {spec.name} on {table.device} ({table.arch}): {path}",
                  markup=False)


def _rank_by_model(spec, a, as_json: bool) -> None:
    """kgen tune --arch for an arch that is not here: the candidates ranked (cli_tables.ranking)."""
    r = cli_tables.ranking(spec, a)
    tuned = r.pop("table")
    if as_json:
        print(json.dumps(r, indent=2))
        return
    model = f"the MODEL, not a measurement (kgen/model.py: {validation()}; over the benchmark grid)"
    how = (f"by the shape buckets each won when timed on {tuned.device} (tuned table {tuned.path}), then by {model}"
           if tuned else f"by {model}")
    console.print(f"No {a.name} GPU here: {spec.name}'s candidate tilings on {a.name} ranked {how}; no table is "
                  f"written." + (f" The model has no entry for the {', '.join(r['unmodeled'])} loop ('not modeled')."
                                 if r["unmodeled"] else ""), markup=False)
    cli_tables.print_ranking(console, r["rows"], str(tuned.path) if tuned else None)
