"""The tables the kgen command line prints (kgen/cli.py): the build report, the tiling per shape
bucket, the modeled times, and the model's ranking of candidate tilings."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from . import designs, sass
from .arch import get_arch
from .model import modeled, rank_by_model, validation
from .tuning import buckets, candidates
from .version import __version__


def build_table(rows: list[dict], title: str, wide: bool) -> Table:
    """The build report: at 80 columns every kernel's name, arch, registers, spills, shared memory,
    CTAs/SM, cubin size and status; --wide adds the rest of the row."""
    cols = ["kernel", "arch", *(["variant id"] if wide else []), "regs", "spill", "smem", "CTA/SM",
            *(["limit", "SASS"] if wide else []), "cubin", "status", *(["s"] if wide else [])]
    table = Table(title=title, caption="spill, smem, cubin: bytes" + ("" if wide else "; --wide for more"),
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in cols:
        table.add_column(col, justify="left" if col in ("kernel", "arch", "variant id", "limit", "SASS", "status")
                         else "right", no_wrap=col not in ("variant id", "SASS"))
    for r in rows:
        cells = {"kernel": r["kernel"], "arch": r["arch"], "variant id": r["variant_id"], "regs": r["registers"],
                 "spill": r["spill_bytes"], "smem": r["smem_bytes"], "CTA/SM": r["occupancy"]["ctas_per_sm"],
                 "limit": r["limit"], "SASS": sass.summary(r["sass"]), "cubin": r["cubin_bytes"],
                 "status": r["status"], "s": f"{r['seconds']:.2f}"}
        table.add_row(*(str(cells[c]) for c in cols))
    return table


def print_buckets(console: Console, table, p) -> None:
    """Which tiling each shape bucket runs, and why."""
    if table is None:
        console.print(f"shape buckets: no tuned table for this spec, {p.arch.name} and kgen {__version__}: every bucket "
                      f"runs the heuristic plan above (kgen tune writes one)", highlight=False, markup=False)
        return
    t = Table(title=f"tiling per shape bucket (tuned table {table.path}, {table.device})")
    for col in ("bucket (tree/batch/context)", "runs", "µs", "heuristic µs", "noise"):
        t.add_column(col, justify="left" if col in ("bucket (tree/batch/context)", "runs") else "right")
    for b in buckets():
        c = table.choices.get(b.key)
        if c is None:
            t.add_row(b.key, f"heuristic ({designs.text(p.tiles)}): not tuned", "", "", "")
        else:
            t.add_row(b.key, designs.text(c.tiles), f"{c.us:.1f}", f"{c.default_us:.1f}", f"{100 * c.noise:.1f}%")
    console.print(t)


def print_model(console: Console, modeled: list) -> None:
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


def print_model_ranking(console: Console, spec, a) -> None:
    """kgen tune --arch for an arch that is not here: the candidates ranked by the model."""
    tried = [t for t in candidates(spec, a) if modeled(t)]
    ranked = rank_by_model(spec, a, tried)
    console.print(f"[bold]MODEL, not a measurement[/bold]: no {a.name} GPU here, so the candidate tilings are "
                  f"ranked by the performance model (kgen/model.py; {validation()}) over the benchmark grid; "
                  f"no table is written.", highlight=False)
    t = Table(title=f"{spec.name} on {a.name} (model)")
    for col in ("rank", "tiling", "modeled µs (geometric mean over the grid)"):
        t.add_column(col, justify="left" if col == "tiling" else "right")
    for i, (tiles, us) in enumerate(ranked, 1):
        t.add_row(str(i), designs.text(tiles), f"{us:.1f}")
    console.print(t)
