"""Where a kernel's warps wait, by SASS line: reads ncu's source page (PC sampling) exported as CSV.

    ncu --clock-control none -k regex:sparse_v --launch-skip 2 -c 1 --section SourceCounters \\
        -o /tmp/src python -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768 --calls 3
    ncu --import /tmp/src.ncu-rep --page source --print-source sass --csv | gzip > sass.csv.gz
    python -m bench.sass_samples sass.csv.gz [--stall long_sb] [--top 20] [--block 50]

Prints the samples by stall reason, the lines holding most samples of one reason (each with its
top three reasons), and the samples by runs of --block consecutive lines with their leading opcodes
(a loop's Q·K, softmax, P·V and the producer show as separate runs). It found the key masks' wait
of bench/NOTES.md v106: one SHF holding 11% of the union's samples.
"""

from __future__ import annotations

import argparse
import csv
import gzip
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass(frozen=True)
class Line:
    index: int
    source: str
    samples: float
    stalls: dict[str, float]  # reason (without "stall_") -> samples

    @property
    def opcode(self) -> str:
        """The opcode without its predicate and modifiers: `@!P0 LDG.E R2, ...` -> LDG."""
        words = self.source.split()
        if not words:
            return "?"
        return (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def read(path: Path) -> tuple[str, list[Line]]:
    """The kernel's name and its SASS lines from ncu's CSV (plain or gzipped): a first row naming the
    kernel, a header, then one row a SASS instruction."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or SAMPLES not in rows[1]:
        raise ValueError(f"{path}: not ncu's SASS source page as CSV (no {SAMPLES!r} column)")
    kernel = rows[0][1] if len(rows[0]) > 1 else "?"
    col = {name: i for i, name in enumerate(rows[1])}
    reasons = [h for h in rows[1] if h.startswith("stall_") and "(Not Issued)" not in h]
    lines = [Line(i, row[col["Source"]].strip(), _number(row[col[SAMPLES]]),
                  {r[len("stall_"):]: _number(row[col[r]]) for r in reasons})
             for i, row in enumerate(rows[2:]) if len(row) == len(rows[1])]
    return kernel, lines


def report(kernel: str, lines: list[Line], stall: str, top: int, block: int) -> str:
    total = sum(x.samples for x in lines) or 1.0
    by_reason = Counter()
    for x in lines:
        by_reason.update(x.stalls)
    out = [f"{kernel}: {total:.0f} samples"]
    out += [f"  {r:<20} {v:8.0f} {100 * v / total:5.1f}%" for r, v in by_reason.most_common(8)]
    out.append(f"lines with most '{stall}' samples:")
    for x in sorted(lines, key=lambda x: -x.stalls.get(stall, 0.0))[:top]:
        lead = ", ".join(f"{r} {v:.0f}" for r, v in Counter(x.stalls).most_common(3) if v)
        out.append(f"  {x.index:5d} {x.stalls.get(stall, 0.0):6.0f} of {x.samples:6.0f}  {x.source[:60]:<60}  {lead}")
    out.append(f"samples by {block} lines:")
    for start in range(0, len(lines), block):
        run = lines[start:start + block]
        samples = sum(x.samples for x in run)
        if samples < 0.005 * total:
            continue
        ops = Counter()
        for x in run:
            ops[x.opcode] += x.samples
        lead = " ".join(f"{op}:{v:.0f}" for op, v in ops.most_common(4))
        out.append(f"  {start:5d}-{start + len(run) - 1:5d} {samples:7.0f} {100 * samples / total:5.1f}%  {lead}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sass_samples", description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path)
    p.add_argument("--stall", default="long_sb", help="the reason whose lines to list (ncu's name without stall_)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--block", type=int, default=50)
    args = p.parse_args(argv)
    print(report(*read(args.csv), args.stall, args.top, args.block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
