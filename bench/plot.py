"""Plot a benchmark result, one group of bars per measured shape: kgen's % of its floors, and
kgen's speedup over each peer timed in the run (SGLang's Triton, FlashInfer, FlashMLA; above 1:
kgen is faster). A panel is drawn only for what was measured, so a run without Triton or peers
has no empty panel.

    python -m bench.plot bench/results/<spec>-<time>.json [out.png]
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

# (label, row key): what kgen's speedup is computed against (time of the peer / kgen's time)
PEER_TIMES = (("SGLang Triton", "us_triton"), ("FlashInfer fa3", "us_flashinfer_fa3"),
              ("FlashInfer fa2", "us_flashinfer_fa2"), ("FlashMLA", "us_flashmla"))
FLOORS = (("% of floor (mma.sync)", "pct_floor"), ("% of GEMM floor", "pct_floor_gemm"))
INCH_PER_SHAPE = 0.75  # a tick label is "B32 L131072" at 7 points
SHAPES_PER_AXES = 16  # more shapes than this (the full grid) go on further rows of panels
TITLE_POINTS = 11


def shape_label(r: dict) -> str:
    return f"B{r['B']} L{r['L']}\nT{r['T']} H{r['H']}\n{'decode' if r['T'] == 1 else 'verify'} P{r['page_size']}"


def _series(rows: list[dict], pairs) -> list[tuple[str, list[float | None]]]:
    """(label, one value per row) of every pair with at least one value: unmeasured series are dropped."""
    out = []
    for label, key in pairs:
        values = [r.get(key) for r in rows]
        if any(v is not None for v in values):
            out.append((label, values))
    return out


def _speedups(rows: list[dict]) -> list[tuple[str, list[float | None]]]:
    return [(label, [t / r["us"] if t else None for t, r in zip(times, rows)])
            for label, times in _series(rows, PEER_TIMES)]


def title(result: dict, rows: list[dict]) -> str:
    c = result.get("ceilings", {})
    plan = result.get("plan_arch") or "its own"
    pages = sorted({r["page_size"] for r in rows})
    gemm = f", GEMM {c['gemm_tflops']:.0f}" if c.get("gemm_tflops") else ""
    chains = any(r.get(key) for r in rows for _, key in PEER_TIMES[1:])
    return (f"kgen {result.get('spec', '')} on {result.get('device', '')}, {plan} plan, page size "
            f"{'/'.join(map(str, pages)) or '?'}: floors from copy {c.get('copy_tbps', 0):.2f} TB/s and mma.sync "
            f"{c.get('mma_tflops', 0):.0f}{gemm} TFLOP/s" + ("; FlashInfer and FlashMLA run a chain (causal), kgen "
                                                             "random trees" if chains else ""))


def _bars(ax, labels: list[str], series, *, log: bool):
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * width for j, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=6, rotation=90 if n * len(labels) > 12 else 0, padding=2)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    if log:
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", lw=0.8)
        top = max(v for _, vs in series for v in vs if v is not None)
        bottom = min(v for _, vs in series for v in vs if v is not None)
        ax.set_ylim(min(0.5, bottom / 1.5), max(2.0, top * 4))  # room for the bar labels
    else:
        ax.axhline(100, color="grey", lw=0.8)
        top = max(v for _, vs in series for v in vs if v is not None)
        ax.set_ylim(0, max(110, top * 1.2))
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=len(series))


def figure(result: dict):
    """The matplotlib figure of `result` (a results JSON, loaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("us")]
    chunks = [rows[i:i + SHAPES_PER_AXES] for i in range(0, len(rows), SHAPES_PER_AXES)]
    panels = []  # (title, rows, series, log scale)
    for i, part in enumerate(chunks):
        more = f" ({i + 1}/{len(chunks)})" if len(chunks) > 1 else ""
        panels.append((f"kgen: % of floor (higher is better){more}", part, _series(part, FLOORS), False))
        speedups = _speedups(part)
        if speedups:
            panels.append((f"kgen's speedup over each peer (x; above 1: kgen faster){more}", part, speedups, True))
    width = max(8.0, 1.5 + INCH_PER_SHAPE * min(len(rows), SHAPES_PER_AXES))
    fig = plt.figure(figsize=(width, 1.2 + 3.6 * max(1, len(panels))))
    # wrapped to the figure's width (~0.6 em per character), so neither edge cuts it
    chars = max(40, int(width * 72 / (TITLE_POINTS * 0.6)) - 4)
    fig.suptitle("\n".join(textwrap.wrap(title(result, rows), chars)), fontsize=TITLE_POINTS)
    if not panels:
        fig.text(0.5, 0.4, "no shape was measured (see the JSON's skipped rows)", ha="center", fontsize=10)
    for i, (name, part, series, log) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        _bars(ax, [shape_label(r) for r in part], series, log=log)
        ax.set_title(name, fontsize=9)
    fig.tight_layout()
    return fig


def plot(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = figure(result)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else src.with_suffix(".png")
    print(plot(json.loads(src.read_text()), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
