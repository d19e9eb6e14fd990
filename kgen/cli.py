"""The kgen command line: build, show, inspect, cache."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import sass
from .arch import get_arch
from .build import build, build_variant
from .cache import KernelCache
from .errors import KgenError
from .model import grid, predict, validation
from .plan import plan
from .render import write_generated
from .spec import load_spec

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Generate, compile and cache kgen kernels.")
cache_app = typer.Typer(no_args_is_help=True, help="Inspect or clear the cubin cache.")
app.add_typer(cache_app, name="cache")
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


def _fail(e: Exception) -> None:
    err_console.print(f"[red]error:[/red] {str(e).splitlines()[0]}", highlight=False, soft_wrap=True)
    detail = str(e).splitlines()[1:]
    if detail:
        err_console.print("\n".join(detail), highlight=False, markup=False)
    raise typer.Exit(1)


@app.command("build")
def build_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    arch: Optional[List[str]] = typer.Option(None, "--arch", help="compile for this arch (repeatable); default: the spec's target"),
    out: Path = typer.Option(Path("generated"), "--out", help="where generated/<name>/ is written"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON instead of a table"),
) -> None:
    """Render and compile every kernel of SPEC; write sources and a manifest under --out."""
    start = time.perf_counter()
    try:
        spec = load_spec(spec_path)
        archs = [get_arch(a).name for a in (arch or [spec.target.arch])]
        p = plan(spec)
        write_generated(p, out)
        total = len(p.variants) * len(archs)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=err_console, transient=True, disable=as_json or not sys.stderr.isatty()) as bar:
            task = bar.add_task(f"building {spec.name}", total=total)
            built = build(p, archs, KernelCache(), on_done=lambda b: bar.advance(task), inspect=True)
    except KgenError as e:
        _fail(e)
    rows = [b.row() for b in built]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{spec.name}: {len(rows)} kernels in {time.perf_counter() - start:.2f} s "
                        f"(plan for {p.arch.name}, sources in {out / spec.name})")
    left = ("kernel", "arch", "variant id", "limit", "SASS", "status")
    for col in ("kernel", "arch", "variant id", "regs", "spill B", "smem B", "CTAs/SM", "limit", "SASS",
                "cubin B", "status", "s"):
        table.add_column(col, justify="left" if col in left else "right", no_wrap=col in ("SASS", "limit"))
    for r in rows:
        table.add_row(r["kernel"], r["arch"], r["variant_id"], str(r["registers"]), str(r["spill_bytes"]),
                      str(r["smem_bytes"]), str(r["occupancy"]["ctas_per_sm"]), r["limit"], sass.summary(r["sass"]),
                      str(r["cubin_bytes"]), r["status"], f"{r['seconds']:.2f}")
    console.print(table)
    problems = [f"{b.variant.name} ({b.arch}): {msg}" for b in built for msg in b.problems()]
    for line in problems:
        err_console.print(f"[yellow]warning:[/yellow] {line}", highlight=False)


@app.command("show")
def show_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
) -> None:
    """Print the plan (tiles, threads, stages, shared-memory budget against the arch limit), each
    kernel's ptxas report, occupancy and SASS counts (built or cached), and the modeled sm_120
    time of the DESIGN §9 grid."""
    try:
        spec = load_spec(spec_path)
        p = plan(spec)
        built = build(p, [p.arch.name], KernelCache(), inspect=True)
        modeled = [predict(spec, shape, "sm_120") for shape in grid(spec)]
    except KgenError as e:
        _fail(e)
    t, a = p.tiles, p.arch
    console.print(f"[bold]{spec.name}[/bold]: plan for {a.name} ({a.description}); "
                  f"H={spec.model.num_q_heads} D={spec.model.head_dim} Dv={spec.model.value_dim} "
                  f"page={spec.cache.page_size} kv={spec.cache.kv_dtype} tree={'static ' if spec.tree.is_static else ''}"
                  f"{spec.tree.nodes} nodes")
    console.print(f"attention tiles: BM={t.bm} packed (token, head) rows, BN={t.bn} KV rows, "
                  f"{t.warps_m}x4 compute warps + 1 producer warp ({t.threads} threads), "
                  f"{t.stages}-stage bulk-copy ring")
    console.print(f"shared memory: {p.budget['attention_smem']} B of {a.smem_per_block} B per block "
                  f"({p.budget['attention_smem_headroom']} B headroom)")
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
    _print_model(modeled)


def _print_model(modeled: list) -> None:
    a = get_arch("sm_120")
    console.print(f"[bold]MODEL, not a measurement[/bold]: {a.name} time from the SASS of the tile loop and the "
                  f"arch's rates ({a.sm_count} SMs at {a.clock_ghz} GHz, {a.dram_gbps:.0f} GB/s), per-call terms "
                  f"fitted on the H200 (kgen/model.py); {validation()}. Floor = max(bytes / {a.dram_gbps:.0f} GB/s, "
                  f"FLOPs / the MMA rate), FLOPs = 2·ΣT·H·(L+T)·(D+Dv).", highlight=False)
    table = Table(title=f"modeled {a.name} time (model)")
    for col in ("H", "T", "L", "B", "page", "MB read", "GFLOP", "floor us", "model us", "% of floor", "binding"):
        table.add_column(col, justify="left" if col == "binding" else "right")
    for m in modeled:
        s, f = m.shape, m.floor
        table.add_row(str(s.H), str(s.T), str(s.L), str(s.B), str(s.page_size), f"{f.bytes / 1e6:.1f}",
                      f"{f.flops / 1e9:.1f}", f"{f.us:.1f}", f"{m.us:.1f}", f"{m.pct_floor:.1f}", m.binding)
    console.print(table)


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
        for v in variants:
            b = build_variant(v, a.name, KernelCache(), inspect=True)
            print(f"// {v.variant_id} for {a.name}: {b.report.registers} registers, {b.report.spill_bytes} B spills, "
                  f"{b.occupancy.ctas_per_sm} CTAs/SM (limit: {b.occupancy.limit})\n// {sass.summary(b.sass)}")
            print(sass.dump(b.cubin, a.name, line_info=line_info))
    except KgenError as e:
        _fail(e)


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is and what it holds."""
    info = KernelCache().info()
    console.print(f"{info['root']}: {info['entries']} entries, {info['bytes']} bytes (schema v{info['schema']})")


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
    graph: bool = typer.Option(True, "--graph/--no-graph", help="time by CUDA-graph replay (default) or eagerly"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="start no new shape after this many seconds"),
    out: Path = typer.Option(Path("bench/results"), "--out", help="where the JSON and PNG are written"),
) -> None:
    """(GPU) Benchmark SPEC: the two ceilings, the DESIGN §9 grid and SGLang's Triton baseline;
    a table, bench/results/<spec>-<time>.json and a PNG plot. Same as python -m bench.run."""
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
                   triton=triton, graph=graph, time_limit=time_limit, out_dir=out)
    except (BenchError, KgenError, ValueError) as e:
        _fail(e)
    raise typer.Exit(code)


@app.command("tune")
def tune_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    budget_s: float = typer.Option(300.0, "--budget-s", help="start no new shape bucket after this many seconds"),
    out: Optional[Path] = typer.Option(None, "--out", help="table file (default: the user table under KGEN_CACHE_DIR/tuned)"),
) -> None:
    """(GPU) Time the candidate attention tilings of SPEC per shape bucket on the GPU present and write
    the winners to a tuned table, which kgen.jit then uses for that spec, arch and kgen version."""
    from .tuning import buckets, table_name, user_dir

    try:
        import torch

        if not torch.cuda.is_available():
            raise KgenError("kgen tune times on the GPU present, and torch sees none here")
        from .tuner import tune

        spec = load_spec(spec_path)
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
