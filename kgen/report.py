"""The tables the kgen command line prints (kgen/cli.py), 80 columns wide without cutting a number or a name.

Every table here is built from rows of plain values, the same rows `--json` prints, so what a
table shows and what the JSON holds cannot drift apart. A table wider than the terminal is never
cut: `kgen build --wide` says what it needs and prints each kernel as a block of lines instead.
"""

from __future__ import annotations

from collections import Counter

from rich import box
from rich.console import Console
from rich.table import Table

from . import designs, sass
from .model import modeled, rank_by_model
from .plan import plan
from .tuning import candidates, find_table

TILES_LEGEND = ("tiling: mma_sync:BM,BN,WARPS_M,STAGES,MIN_BLOCKS = packed (token, head) rows per tile, KV rows "
                "per tile, compute warps along the rows, KV ring stages, CTAs per SM the kernel is built for; "
                "wgmma:BN,STAGES,MIN_BLOCKS and seesaw:BN,STAGES,MIN_BLOCKS = the same for sm_90's two wgmma "
                "loops (64 rows per tile); overlap:BN,STAGES,AHEAD,MIN_BLOCKS = the same for the overlap loop (32 "
                "rows per tile; AHEAD 1: Q·K a tile ahead)")


def table(columns: list[str], rows: list[list[object]], left: tuple[str, ...] = (), wrap: tuple[str, ...] = ()) -> Table:
    """A borderless table: names left, numbers right; cells never cut (`wrap` columns wrap at spaces)."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=col not in wrap,
                     overflow="fold")
    for row in rows:
        t.add_row(*("" if c is None else str(c) for c in row))
    return t


def needed_width(console: Console, renderable) -> int:
    """Columns `renderable` takes unwrapped (a measurement is otherwise capped at the terminal's width)."""
    return console.measure(renderable, options=console.options.update_width(10_000)).maximum


def human_bytes(n: int) -> str:
    """1234567 -> "1.2 MB" (powers of 1000, as disks and `du --si` count)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def wrap_pairs(text: str, width: int) -> list[str]:
    """Lines of at most `width` from "NAME COUNT NAME COUNT ..." (sass.summary), never parting a count from its name."""
    words = text.split()
    pairs = [" ".join(words[i:i + 2]) for i in range(0, len(words), 2)]
    lines: list[str] = []
    for pair in pairs:
        if lines and len(lines[-1]) + 1 + len(pair) <= width:
            lines[-1] += " " + pair
        else:
            lines.append(pair)
    return lines


# ---- kgen build ----

BUILD_COLUMNS = ("kernel", "arch", "regs", "spill", "smem", "CTA/SM", "cubin", "status")
WIDE_COLUMNS = ("kernel", "arch", "variant id", "regs", "spill", "smem", "CTA/SM", "limit", "SASS", "cubin",
                "status", "s")


def _build_cells(r: dict) -> dict[str, object]:
    return {"kernel": r["kernel"], "arch": r["arch"], "variant id": r["variant_id"], "regs": r["registers"],
            "spill": r["spill_bytes"], "smem": r["smem_bytes"], "CTA/SM": r["occupancy"]["ctas_per_sm"],
            "limit": r["limit"], "SASS": sass.summary(r["sass"]) if r["sass"] else "", "cubin": r["cubin_bytes"],
            "status": r["status"], "s": f"{r['seconds']:.2f}"}


def print_build(console: Console, err: Console, rows: list[dict], wide: bool) -> None:
    """The build report: at 80 columns every kernel's name, arch, registers, spills, shared memory,
    CTAs/SM, cubin size and status; --wide adds the variant id, occupancy limit, SASS and seconds,
    as a table where the terminal is wide enough, else as one block of lines per kernel."""
    columns = WIDE_COLUMNS if wide else BUILD_COLUMNS
    cells = [_build_cells(r) for r in rows]
    t = table(list(columns), [[c[col] for col in columns] for c in cells],
              left=("kernel", "arch", "variant id", "limit", "SASS", "status"), wrap=("SASS",))
    need = needed_width(console, t)
    if need <= console.width:
        console.print(t)
        console.print("spill, smem, cubin: bytes" + ("" if wide else "; --wide adds variant ids, SASS counts "
                                                   "and seconds; --json every field"), highlight=False)
        return
    err.print(f"--wide: the table needs {need} columns and this terminal has {console.width}; each kernel "
              f"follows as a block (widen the terminal for the table; --json has every field)",
              highlight=False, soft_wrap=True)
    for c in cells:
        console.print(f"{c['kernel']}  {c['arch']}  {c['status']} in {c['s']} s", highlight=False)
        console.print(f"  variant id {c['variant id']}", highlight=False, markup=False)
        console.print(f"  regs {c['regs']}  spill {c['spill']} B  smem {c['smem']} B  CTA/SM {c['CTA/SM']} "
                      f"(limit: {c['limit']})  cubin {c['cubin']} B", highlight=False)
        for i, line in enumerate(wrap_pairs(c["SASS"], console.width - 7)):
            console.print(("  SASS " if i == 0 else " " * 7) + line, highlight=False)


# ---- kgen show ----

def show_kernel_rows(built) -> list[dict]:
    """One row per kernel of a plan, as `kgen show` prints it and --json emits it."""
    return [{"kernel": b.variant.name, "variant_id": b.variant.variant_id, "threads": b.variant.threads,
             "dyn_smem_bytes": b.variant.smem_bytes, "min_blocks": b.variant.min_blocks,
             "registers": b.report.registers, "spill_bytes": b.report.spill_bytes,
             "ctas_per_sm": b.occupancy.ctas_per_sm, "limit": b.occupancy.limit,
             "sass": sass.summary(b.sass)} for b in built]


def print_show_kernels(console: Console, rows: list[dict]) -> None:
    console.print(table(["kernel", "threads", "smem", "min/SM", "regs", "spill", "CTA/SM", "limit"],
                        [[r["kernel"], r["threads"], r["dyn_smem_bytes"], r["min_blocks"], r["registers"],
                          r["spill_bytes"], r["ctas_per_sm"], r["limit"]] for r in rows], left=("kernel", "limit")))
    console.print("smem: dynamic shared memory, spill: bytes; min/SM: the CTAs per SM the kernel is built for "
                  "(__launch_bounds__); CTA/SM: what its registers and shared memory allow, and the resource that "
                  "limits it",
                  highlight=False)
    # A block a kernel, not a table: a sparse spec's variant ids (~65 characters) beside the kernel
    # column pass 80, and a table would fold an id mid-name.
    console.print("\nkernel, variant id, SASS instruction counts", style="bold", highlight=False)
    for r in rows:
        head = f"{r['kernel']}  {r['variant_id']}"
        console.print(head if len(head) <= console.width else f"{r['kernel']}\n  {r['variant_id']}",
                      highlight=False, markup=False, crop=False, soft_wrap=True)
        for line in wrap_pairs(r["sass"], max(40, console.width - 2)):
            console.print("  " + line, highlight=False)


def bucket_rows(table_, buckets) -> list[dict]:
    rows = []
    for b in buckets:
        c = table_.choice_for(b)
        own = table_.choices.get(b.key)  # else c is the older bucket's: its tiling runs, its times are not here
        runs = designs.text(c.tiles) + ("" if own else " *") if c else "the heuristic plan"
        rows.append({"bucket": b.key, "runs": runs, "tuned": own is not None,
                     "as_bucket": b.older.key if c and not own else None,
                     "us": round(own.us, 1) if own else None, "heuristic_us": round(own.default_us, 1) if own else None,
                     "noise_pct": round(100 * own.noise, 1) if own else None})
    return rows


def print_buckets(console: Console, rows: list[dict], source: str) -> None:
    console.print(f"tiling per shape bucket (tree/batch/context): {source}", highlight=False, markup=False)
    if not rows:
        return
    console.print(table(["bucket", "runs", "µs", "heuristic µs", "noise %"],
                        [[r["bucket"], r["runs"], r["us"],
                          r["heuristic_us"], r["noise_pct"]] for r in rows], left=("bucket", "runs")))
    if any(r["as_bucket"] for r in rows):
        console.print("* the table has no choice of its own there (tuned before contexts past 65536 tokens were a "
                      "class): the \"long\" bucket's tiling runs", highlight=False, markup=False)
    console.print(TILES_LEGEND, highlight=False, markup=False)


def model_rows(modeled) -> list[dict]:
    return [{"H": m.shape.H, "T": m.shape.T, "L": m.shape.L, "B": m.shape.B, "page": m.shape.page_size,
             "mb_read": round(m.floor.bytes / 1e6, 1), "gflop": round(m.floor.flops / 1e9, 1),
             "floor_us": round(m.floor.us, 1), "model_us": round(m.us, 1), "pct_floor": round(m.pct_floor, 1),
             "binding": m.binding} for m in modeled]


def print_model(console: Console, rows: list[dict]) -> None:
    keys = ("H", "T", "L", "B", "mb_read", "gflop", "floor_us", "model_us", "pct_floor", "binding")
    console.print(table(["H", "T", "L", "B", "MB read", "GFLOP", "floor µs", "model µs", "% floor", "binding"],
                        [[r[k] for k in keys] for r in rows], left=("binding",)))


def sparse_rows(spec) -> list[dict]:
    """A sparse spec's modeled sm_120 calls (kgen/sparse_model.py) over its show shapes."""
    from .sparse_model import predict_sparse, show_shapes, unions  # local: only sparse specs need it

    rows = []
    for s in show_shapes(spec):
        m, sh = predict_sparse(spec, s, "sm_120"), s.shape
        rows.append({"H": sh.H, "T": sh.T, "L": sh.L, "B": sh.B, "shared": s.shared,
                     "union_rows": sh.B * unions(spec, s, sh.T), "floor_us": round(m.floor.us, 1),
                     "model_us": round(m.us, 1), "pct_floor": round(m.pct_floor, 1), "binding": m.binding})
    return rows


def print_sparse(console: Console, rows: list[dict]) -> None:
    keys = ("H", "T", "L", "B", "shared", "union_rows", "floor_us", "model_us", "pct_floor", "binding")
    console.print(table(["H", "T", "L", "B", "shared", "union rows", "floor µs", "model µs", "% floor", "binding"],
                        [[f"{r[k]:.0%}" if k == "shared" else r[k] for k in keys] for r in rows], left=("binding",)))


# ---- kgen tune --arch (the model's ranking) ----

def ranking(spec, arch) -> dict:
    """`kgen tune --arch` without that GPU: every candidate tiling of `arch` (and the current plan's),
    ranked by the buckets each won in a tuned table measured on that arch where one exists, then by
    the model's geometric mean over the grid; equal keys share a rank (tied). Designs the model has
    no entry for are listed in "unmodeled" (their modeled_us is None)."""
    current = plan(spec, arch).tiles
    tried = list({designs.text(t): t for t in [current, *candidates(spec, arch)]}.values())
    modeled_us = {designs.text(t): round(us, 1) for t, us in rank_by_model(spec, arch, [t for t in tried if modeled(t)])}
    tuned = find_table(spec, arch.name)
    won = Counter(designs.text(c.tiles) for c in tuned.choices.values()) if tuned else None
    rows = [{"tiling": designs.text(t), "modeled_us": modeled_us.get(designs.text(t)),
             "buckets_won": won[designs.text(t)] if won is not None else None, "current": t == current}
            for t in tried]

    def key(r):
        return -(r["buckets_won"] or 0), r["modeled_us"] if r["modeled_us"] is not None else float("inf")

    rows.sort(key=key)
    for r in rows:
        same = [i for i, o in enumerate(rows) if key(o) == key(r)]
        r["rank"], r["tied"] = same[0] + 1, len(same) > 1
    return {"spec": spec.name, "arch": arch.name, "table": tuned, "rows": rows,
            "ranked_by": (f"buckets won in the tuned table {tuned.path} (measured on {tuned.device}), then the "
                          f"model" if tuned else "the model"),
            "unmodeled": sorted({t.design for t in tried if not modeled(t)})}


def print_ranking(console: Console, rows: list[dict], measured: str | None) -> None:
    """rows: rank, tied, tiling, modeled_us (None: not modeled), buckets_won (None: no measured table), current."""
    cols = ["rank", "tiling", "model µs", *(["buckets won"] if measured else []), "plan"]
    console.print(table(cols, [[f"{r['rank']}{'=' if r['tied'] else ''}", r["tiling"],
                                "not modeled" if r["modeled_us"] is None else r["modeled_us"],
                                *([r["buckets_won"]] if measured else []),
                                "current" if r["current"] else ""] for r in rows], left=("tiling", "plan")))
    notes = ["model µs: the geometric mean of the modeled times over the benchmark grid",
             "=: tied with the other rows of that rank", "current: the tiling the heuristic plan runs"]
    if measured:
        notes.insert(1, f"buckets won: of the shape buckets timed on the GPU in {measured}")
    console.print("; ".join(notes), highlight=False, markup=False)
    console.print(TILES_LEGEND, highlight=False, markup=False)
