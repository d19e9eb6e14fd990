"""The kgen command line: build, show, cache."""

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

from .arch import get_arch
from .build import build
from .cache import KernelCache
from .errors import KgenError
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
            built = build(p, archs, KernelCache(), on_done=lambda b: bar.advance(task))
    except KgenError as e:
        _fail(e)
    rows = [b.row() for b in built]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{spec.name}: {len(rows)} kernels in {time.perf_counter() - start:.2f} s "
                        f"(plan for {p.arch.name}, sources in {out / spec.name})")
    for col in ("kernel", "arch", "variant id", "regs", "spill B", "smem B", "cubin B", "status", "s"):
        table.add_column(col, justify="left" if col in ("kernel", "arch", "variant id", "status") else "right")
    for r in rows:
        table.add_row(r["kernel"], r["arch"], r["variant_id"], str(r["registers"]), str(r["spill_bytes"]),
                      str(r["smem_bytes"]), str(r["cubin_bytes"]), r["status"], f"{r['seconds']:.2f}")
    console.print(table)


@app.command("show")
def show_cmd(spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file")) -> None:
    """Print the plan: tiles, threads, stages, shared-memory budget against the arch limit."""
    try:
        spec = load_spec(spec_path)
        p = plan(spec)
    except KgenError as e:
        _fail(e)
    t, a = p.tiles, p.arch
    console.print(f"[bold]{spec.name}[/bold]: plan for {a.name} ({a.description}); "
                  f"H={spec.model.num_q_heads} D={spec.model.head_dim} Dv={spec.model.value_dim} "
                  f"page={spec.cache.page_size} kv={spec.cache.kv_dtype} tree={'static ' if spec.tree.is_static else ''}"
                  f"{spec.tree.nodes} nodes")
    console.print(f"attention tiles: BM={t.bm} packed (token, head) rows, BN={t.bn} KV rows, "
                  f"{t.warps_m}x4 warps ({t.threads} threads), {t.stages}-stage cp.async ring")
    console.print(f"shared memory: {p.budget['attention_smem']} B of {a.smem_per_block} B per block "
                  f"({p.budget['attention_smem_headroom']} B headroom)")
    table = Table()
    for col in ("kernel", "variant id", "threads", "dyn smem B", "min blocks/SM"):
        table.add_column(col)
    for v in p.variants:
        table.add_row(v.name, v.variant_id, str(v.threads), str(v.smem_bytes), str(v.min_blocks))
    console.print(table)


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


def main() -> None:  # pragma: no cover - console script entry
    app()
