"""The kgen command line: build, show, inspect, cache, bench."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from . import report, sass
from .version import __version__
from .arch import get_arch
from .build import build, build_variant
from .cache import KernelCache
from .errors import KgenError
from .model import grid, predict
from .plan import plan
from .tuning import find_table
from .render import render, templates_dir, write_generated
from .spec import load_spec

app = typer.Typer(add_completion=False, no_args_is_help=True)
cache_app = typer.Typer(no_args_is_help=True, help="Inspect or clear the cubin cache.")
app.add_typer(cache_app, name="cache")
console = Console(width=None if sys.stdout.isatty() else 200)  # wide tables keep whole rows in a pipe
term_console = Console()  # the terminal's width (COLUMNS), 80 when output is not a terminal
err_console = Console(stderr=True, highlight=False)


def _say(kind: str, style: str, message: str) -> None:
    """`kind: message` on stderr; the message is printed as is (no markup)."""
    err_console.print(Text(f"{kind}: ", style=style) + Text(message), soft_wrap=True)


def _fail(e: Exception) -> None:
    first, *detail = str(e).splitlines() or [type(e).__name__]
    _say("error", "red", first)
    if detail:
        err_console.print(Text("\n".join(detail)))
    raise typer.Exit(1)


def _print_version(value: bool) -> None:
    if value:
        print(f"kgen {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print kgen's version and exit.")) -> None:
    """Generate, compile and cache kgen kernels."""


@app.command("build")
def build_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    arch: Optional[List[str]] = typer.Option(None, "--arch", help="plan and compile for this arch (repeatable); default: the spec's target"),
    out: Path = typer.Option(Path("generated"), "--out", help="where generated/<name>/ is written"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON instead of a table"),
    wide: bool = typer.Option(False, "--wide", help="also the variant id, occupancy limit, SASS counts and seconds"),
) -> None:
    """Plan, render and compile every kernel of SPEC for each arch (each arch with its own plan);
    write the target plan's sources and a manifest under --out."""
    start = time.perf_counter()
    try:
        spec = load_spec(spec_path)
        plans = [plan(spec, a) for a in (arch or [spec.target.arch])]
        write_generated(plan(spec), out)
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
    title = (f"{spec.name}: {len(rows)} kernels for {designs} in {time.perf_counter() - start:.2f} s, "
             f"sources in {out / spec.name}")
    (console if wide else term_console).print(report.build_table(rows, title, wide))
    for b in built:
        for msg in b.problems():
            _say("warning", "yellow", f"{b.variant.name} ({b.arch}): {msg}")


@app.command("show")
def show_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    arch: Optional[str] = typer.Option(None, "--arch", help="whose plan to show (default: the spec's target)"),
) -> None:
    """Print ARCH's plan (loop design, tiles, threads, stages, shared memory against the arch limit),
    which tiling each shape bucket runs (a tuned table's choice, or the heuristic plan), each kernel's
    ptxas report, occupancy and SASS counts (built or cached), and the modeled sm_120 time of the
    benchmark grid (docs/design.md)."""
    try:
        spec = load_spec(spec_path)
        p = plan(spec, arch)
        built = build(p, [p.arch.name], KernelCache(), inspect=True)
        table = find_table(spec, p.arch.name)
        modeled = [predict(spec, shape, "sm_120") for shape in grid(spec)]
    except KgenError as e:
        _fail(e)
    a = p.arch
    console.print(f"[bold]{spec.name}[/bold]: plan for {a.name} ({a.description}); "
                  f"H={spec.model.num_q_heads} D={spec.model.head_dim} Dv={spec.model.value_dim} "
                  f"page={spec.cache.page_size} kv={spec.cache.kv_dtype} tree={'static ' if spec.tree.is_static else ''}"
                  f"{spec.tree.nodes} nodes", highlight=False)
    console.print(f"attention: {p.tiles.describe()} ({p.tiles.threads} threads)", highlight=False, markup=False)
    console.print(f"shared memory: {p.budget['attention_smem']} B of {a.smem_per_block} B per block "
                  f"({p.budget['attention_smem_headroom']} B headroom)")
    report.print_buckets(console, table, p)
    table = Table()
    for col in ("kernel", "variant id", "threads", "dyn smem B", "min blocks/SM", "regs", "spill B",
                "CTAs/SM", "limit", "SASS"):
        table.add_column(col)
    for b in built:
        v, occ = b.variant, b.occupancy
        table.add_row(v.name, v.variant_id, str(v.threads), str(v.smem_bytes), str(v.min_blocks),
                      str(b.report.registers), str(b.report.spill_bytes), str(occ.ctas_per_sm), occ.limit,
                      sass.summary(b.sass))
    console.print(table)
    report.print_model(console, modeled)


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
            b = build_variant(v, a.name, cache, inspect=True)
            print(f"// {v.variant_id} for {a.name}: {b.report.registers} registers, {b.report.spill_bytes} B spills, "
                  f"{b.occupancy.ctas_per_sm} CTAs/SM (limit: {b.occupancy.limit})\n// {sass.summary(b.sass)}")
            text = sass.dump(b.cubin, a.name, line_info=line_info)
            print(_existing_line_paths(text, v, cache) if line_info else text)
    except KgenError as e:
        _fail(e)


_LINE_FILE = re.compile(r'(//## File ")([^"]*)(")')


def _existing_line_paths(text: str, variant, cache: KernelCache) -> str:
    """nvdisasm's line info names the files as NVRTC saw them (`<name>.cu`, `kgen/<header>.cuh`,
    under the directory the kernel was first compiled in): point them at files that exist — the
    rendered source, written next to the cache, and the headers in kgen's templates."""
    source = cache.root / "sources" / f"{variant.variant_id}.cu"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(render(variant))

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
    info = KernelCache().info()
    console.print(f"{info['root']}: {info['entries']} entries, {info['bytes']} bytes (schema v{info['schema']})",
                  markup=False)


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every cached kernel."""
    n = KernelCache().clear()
    console.print(f"removed {n} entries")


@app.command("bench")
def bench_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="base spec YAML (heads, tree and page size vary over the grid)"),
    quick: bool = typer.Option(False, "--quick", help="a handful of shapes at the spec's head count (under a minute)"),
    page_size: Optional[int] = typer.Option(None, "--page-size", help="KV page size (default: the spec's)"),
    heads: str = typer.Option("8,16", "--heads", help="comma-separated head counts of the grid"),
    triton: bool = typer.Option(True, "--triton/--no-triton", help="time SGLang's Triton extend_attention_fwd too"),
    peers: str = typer.Option("auto", "--peers", help="FlashInfer / FlashMLA timed on the same inputs: auto (the "
                              "plan's: sm_90 flashinfer_fa3,flashmla; else flashinfer_fa2), none, all, or a list"),
    graph: bool = typer.Option(True, "--graph/--no-graph", help="time by CUDA-graph replay (default) or eagerly"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="start no new shape after this many seconds"),
    out: Path = typer.Option(Path("bench/results"), "--out", help="where the JSON and PNG are written"),
) -> None:
    """(GPU) Benchmark SPEC: the ceilings, the benchmark grid (docs/design.md), SGLang's Triton baseline and
    the peers (FlashInfer, FlashMLA); a table, bench/results/<spec>-<time>.json and a PNG plot. Same as
    python -m bench.run."""
    # bench/ lives next to the package in a checkout, not inside the wheel
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / "bench" / "run.py").is_file() and str(root) not in sys.path:
            sys.path.insert(0, str(root))
    try:
        from bench.run import BenchError, run
    except ImportError as e:
        _fail(KgenError(f"kgen bench needs the bench/ folder of a kgen checkout (run it from the repository root): {e}"))
    try:
        code = run(spec_path, quick=quick, page_size=page_size, heads=tuple(int(h) for h in heads.split(",")),
                   triton=triton, graph=graph, time_limit=time_limit, out_dir=out, peers=peers)
    except (BenchError, KgenError, ValueError) as e:
        _fail(e)
    raise typer.Exit(code)


@app.command("tune")
def tune_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    budget_s: float = typer.Option(300.0, "--budget-s", help="start no new shape bucket after this many seconds"),
    arch: Optional[str] = typer.Option(None, "--arch", help="an arch other than the GPU present: rank its candidate "
                                                           "tilings by the performance model (no GPU needed)"),
    out: Optional[Path] = typer.Option(None, "--out", help="table file (default: the user table under KGEN_CACHE_DIR/tuned)"),
) -> None:
    """(GPU) Time the candidate attention tilings of SPEC per shape bucket on the GPU present and write
    the winners to a tuned table, which kgen.jit then uses for that spec, arch and kgen version.
    With --arch for an arch that is not present, rank the candidates by the model instead."""
    from .tuning import buckets, table_name, user_dir

    try:
        spec = load_spec(spec_path)
        import torch

        here = None
        if torch.cuda.is_available():
            from .arch import arch_for_capability

            here = arch_for_capability(*torch.cuda.get_device_capability()).name
        if arch and arch != here:
            report.print_model_ranking(console, spec, get_arch(arch))
            return
        if here is None:
            raise KgenError("kgen tune times on the GPU present, and torch sees none here "
                            "(--arch ARCH ranks an arch's tilings by the performance model instead)")
        from .tuner import tune

        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err_console) as bar:
            task = bar.add_task(f"tuning {spec.name}", total=len(buckets()))

            def done(bucket, r):
                bar.advance(task)
                bar.console.print(f"{bucket.key:20s} " + "  ".join(f"{t} {us:.1f}" for t, us in sorted(r["times"].items()))
                                  + f"  noise {100 * r['noise']:.1f}% -> {r['chosen']}", highlight=False, markup=False)

            table = tune(spec, budget_s, on_bucket=done)
        path = table.save(out or user_dir() / table_name(spec, table.arch))
    except KgenError as e:
        _fail(e)
    console.print(f"{len(table.choices)} buckets tuned for {spec.name} on {table.device} ({table.arch}): {path}",
                  highlight=False, markup=False)


if __name__ == "__main__":  # python -m kgen.cli works as python -m kgen does
    app(prog_name="kgen")
