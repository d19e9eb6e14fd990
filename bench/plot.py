"""Plot a benchmark result: % of floor and speedup vs Triton against context length, per head count.

    python -m bench.plot bench/results/<spec>_<time>.json [out.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STYLES = {1: "-", 8: "--", 32: ":"}  # batch size -> line style
MARKERS = {1: "o", 8: "s", 32: "^"}


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("us")]
    heads = sorted({r["H"] for r in rows}) or [0]
    metrics = [("pct_floor", "% of floor (higher is better)"), ("speedup_vs_triton", "speedup vs SGLang Triton (x)")]
    fig, axes = plt.subplots(len(metrics), len(heads), figsize=(6.5 * len(heads), 4.5 * len(metrics)),
                             squeeze=False)
    trees = sorted({r["T"] for r in rows})
    colors = {t: plt.cm.viridis(i / max(1, len(trees) - 1)) for i, t in enumerate(trees)}
    for col, h in enumerate(heads):
        for row_i, (key, label) in enumerate(metrics):
            ax = axes[row_i][col]
            series: dict[tuple[int, int], list[tuple[int, float]]] = {}
            for r in rows:
                if r["H"] == h and r.get(key) is not None:
                    series.setdefault((r["T"], r["B"]), []).append((r["L"], r[key]))
            for (t, b), pts in sorted(series.items()):
                pts.sort()
                name = f"decode B={b}" if t == 1 else f"T={t} B={b}"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLES.get(b, "-."), marker=MARKERS.get(b, "x"),
                        color=colors[t], label=name)
            ax.set_xscale("log", base=2)
            if key == "speedup_vs_triton":
                ax.set_yscale("log")
            else:
                ax.axhline(100, color="grey", lw=0.8)
            ax.set_xlabel("context length L (tokens)")
            ax.set_ylabel(label)
            ax.set_title(f"H={h}: {label.split(' (')[0]}")
            ax.grid(True, which="both", alpha=0.3)
            if series:
                ax.legend(fontsize=7, ncol=2)
    c = result.get("ceilings", {})
    fig.suptitle(f"kgen {result.get('spec', '')} on {result.get('device', '')}: floor from copy "
                 f"{c.get('copy_tbps', 0):.2f} TB/s and mma.sync {c.get('mma_tflops', 0):.0f} TFLOP/s "
                 f"(page size {rows[0]['page_size'] if rows else '?'})")
    fig.tight_layout()
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
