"""A labelled performance model: the time a spec's kernels would take on an arch we cannot run.

For one benchmark shape (DESIGN §9) the floor on the arch is

    floor = max(bytes / DRAM bandwidth, FLOPs / mma.sync bf16 rate)
    FLOPs = 2 · ΣT · H · (L + T) · (D + Dv)
    bytes = B · L · D · kv_bytes  (the prefix, read once)  +  q, k_tree, o and lse bytes

and the modeled time is floor / efficiency, where the efficiency is the % of floor the same plan
reached on the H200 for that shape (a bench result), or 100% when there is none. It is a model,
never a measurement, and every row carries its inputs.

Bench results (written by `kgen bench`): bench/results/<spec>.json or <spec>-<time>[-suffix].json,
whose names sort by time. Each is a JSON object with a "rows" list (or a bare list of rows); a row
    {"spec": str, "H": int, "T": int, "L": int, "B": int, "page_size": int,
     "us": float | null, "pct_floor": float | null, "mode": "verify" | "decode" (optional)}
has `us` the time measured on the H200 and `pct_floor` = 100 · (H200 floor) / us. Only rows whose
"spec" is this spec's name (the same plan) count; other keys are ignored, rows without a time are
skipped, and for a shape measured in several files the newest file wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .arch import Arch, get_arch
from .errors import KgenError
from .plan import KV_BYTES
from .spec import Spec

GRID_T = (16, 64, 256)
GRID_L = (4096, 32768, 131072)
GRID_B = (1, 8, 32)
ROW_KEYS = {"spec": str, "H": int, "T": int, "L": int, "B": int, "page_size": int}
NO_MEASUREMENT = "no measurement, efficiency 100% (floor)"


class BenchResultError(KgenError, ValueError):
    """A bench result file does not follow the schema above."""


@dataclass(frozen=True)
class Shape:
    H: int
    T: int  # tree tokens per request
    L: int  # prefix tokens per request
    B: int
    page_size: int


@dataclass(frozen=True)
class Floor:
    bytes: int
    flops: int
    dram_us: float
    mma_us: float

    @property
    def us(self) -> float:
        return max(self.dram_us, self.mma_us)

    @property
    def bound(self) -> str:
        return "dram" if self.dram_us >= self.mma_us else "mma"


@dataclass(frozen=True)
class Modeled:
    shape: Shape
    arch: str
    floor: Floor
    efficiency: float  # fraction of floor reached (1.0 without a measurement)
    source: str  # where the efficiency comes from, or NO_MEASUREMENT
    measured_us: float | None  # the H200 time the efficiency comes from

    @property
    def us(self) -> float:
        return self.floor.us / self.efficiency

    def row(self) -> dict:
        return {**vars(self.shape), "arch": self.arch, "kind": "model", "modeled_us": round(self.us, 3),
                "floor_us": round(self.floor.us, 3), "bound": self.floor.bound, "bytes": self.floor.bytes,
                "flops": self.floor.flops, "efficiency_pct": round(100 * self.efficiency, 1),
                "efficiency_source": self.source, "h200_us": self.measured_us}


def grid(spec: Spec) -> list[Shape]:
    """The §9 grid at the spec's own H and page size; T only up to what the spec's tree allows
    (a static tree always has its own node count)."""
    nodes = spec.tree.nodes
    ts = [nodes] if spec.tree.is_static else [t for t in GRID_T if t <= nodes] or [nodes]
    return [Shape(spec.model.num_q_heads, t, l, b, spec.cache.page_size)
            for t in ts for l in GRID_L for b in GRID_B]


def floor(spec: Spec, shape: Shape, arch: Arch) -> Floor:
    m = spec.model
    d, dv, tokens = m.head_dim, m.value_dim, shape.B * shape.T
    kv = KV_BYTES[spec.cache.kv_dtype]
    nbytes = (shape.B * shape.L * d * kv  # prefix rows, read once
              + tokens * d * kv  # k_tree
              + tokens * shape.H * (d * 2 + dv * 2 + 4))  # q in, o and lse out
    flops = 2 * tokens * shape.H * (shape.L + shape.T) * (d + dv)
    return Floor(bytes=nbytes, flops=flops, dram_us=nbytes / (arch.dram_gbps * 1e9) * 1e6,
                 mma_us=flops / (arch.mma_bf16_tflops * 1e12) * 1e6)


def results_files(spec_name: str, results_dir: Path) -> list[Path]:
    """A spec's bench results, oldest first: <spec>.json, then <spec>-<time>*.json by name."""
    if not results_dir.is_dir():
        return []
    files = [p for p in results_dir.glob(f"{spec_name}*.json")
             if p.stem == spec_name or p.stem.startswith(spec_name + "-")]
    return sorted(files, key=lambda p: p.stem)


def load_results(path: Path, spec_name: str) -> dict[Shape, dict]:
    """The timed verify rows of one bench result file for `spec_name`, by shape."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BenchResultError(f"{path}: not a readable JSON bench result ({e})") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise BenchResultError(f"{path}: expected a list of rows or an object with \"rows\"")
    out = {}
    for i, row in enumerate(rows):
        bad = [k for k, t in ROW_KEYS.items() if not isinstance(row, dict) or not isinstance(row.get(k), t)]
        bad += [k for k in ("us", "pct_floor") if isinstance(row, dict) and row.get(k) is not None
                and not isinstance(row[k], (int, float))]
        if bad:
            raise BenchResultError(f"{path}: row {i}: missing or mistyped {', '.join(bad)} "
                                   f"(schema: {', '.join(ROW_KEYS)}, us, pct_floor)")
        if (row["spec"] == spec_name and row.get("mode", "verify") == "verify"
                and row.get("us") and row.get("pct_floor")):
            out[Shape(row["H"], row["T"], row["L"], row["B"], row["page_size"])] = {**row, "file": path.name}
    return out


def model(spec: Spec, arch: str | Arch = "sm_120", results_dir: Path | None = None,
          shapes: list[Shape] | None = None) -> tuple[list[Modeled], list[Path]]:
    """Modeled time of every shape (default: the §9 grid) on `arch`, and the bench files read."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    files = results_files(spec.name, results_dir if results_dir is not None else Path.cwd() / "bench" / "results")
    measured: dict[Shape, dict] = {}
    for path in files:  # oldest first: newer files overwrite
        measured.update(load_results(path, spec.name))
    out = []
    for shape in shapes if shapes is not None else grid(spec):
        f = floor(spec, shape, arch)
        if row := measured.get(shape):
            source = f"H200 {row['us']:.1f} us = {row['pct_floor']:.1f}% of floor ({row['file']})"
            out.append(Modeled(shape, arch.name, f, row["pct_floor"] / 100, source, row["us"]))
        else:
            out.append(Modeled(shape, arch.name, f, 1.0, NO_MEASUREMENT, None))
    return out, files
