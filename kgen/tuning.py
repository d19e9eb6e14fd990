"""Tuned tables: which attention tiling a spec runs on an arch, per shape bucket.

`kgen tune SPEC` times candidate tilings (tuning.candidates) on the GPU present for one
representative shape per bucket and writes the winners to a table; `kgen.jit` reads a table that
matches the spec (its content digest), the arch and this kgen version — the user's (under
KGEN_CACHE_DIR/tuned) before a shipped one (kgen/tuned/ in the package) — and runs, for each
prepared step, the tiling of the step's bucket; buckets (and specs, archs, versions) without an
entry get the heuristic plan (designs.choose).

A bucket is what the host knows of a batch without reading the GPU: tree tokens per request
(total tokens / batch), batch size, and context per request from the capacity of kv_indices
(pages x page size / batch: with an index buffer sized for the longest batch, as CUDA-graph
servers allocate it, the bucket is the long-context one). Contexts past 65536 tokens a request are
a class of their own ("longest": the loops cross over between 32k and 128k, bench/NOTES.md v37); a
table tuned before that class existed answers for it with its "long" choice.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from . import designs
from .arch import Arch
from .env import cache_root
from .designs import Tiles
from .errors import KgenError, PlanError
from .plan import plan
from .version import __version__
from .spec import Spec

SCHEMA = 1
SHIPPED_DIR = Path(__file__).parent / "tuned"
MIN_GAIN = 0.02  # a challenger must win by this fraction and by the measured noise


class TuningError(KgenError, ValueError):
    """A tuned table that cannot be read or does not follow the schema."""


@dataclass(frozen=True)
class Bucket:
    tree: str  # "decode" (1 token per request), "small" (<= 16), "mid" (<= 64), "large"
    batch: str  # "1", "2-8", "9+"
    context: str  # "short" (<= 8192 tokens per request), "long" (<= 65536), "longest"

    @property
    def key(self) -> str:
        return f"{self.tree}/{self.batch}/{self.context}"

    @classmethod
    def of(cls, num_tokens: int, batch: int, context_tokens: int) -> Bucket:
        """The bucket of a batch: `context_tokens` is its prefix capacity (kv_indices pages x page size)."""
        per_req = num_tokens / max(batch, 1)
        tree = "decode" if per_req <= 1 else "small" if per_req <= 16 else "mid" if per_req <= 64 else "large"
        size = "1" if batch <= 1 else "2-8" if batch <= 8 else "9+"
        per_req_context = context_tokens / max(batch, 1)
        context = "short" if per_req_context <= 8192 else "long" if per_req_context <= 65536 else "longest"
        return cls(tree, size, context)

    @property
    def older(self) -> Bucket | None:
        """The bucket that answered for this one in tables tuned before its context class existed."""
        return Bucket(self.tree, self.batch, "long") if self.context == "longest" else None


# One representative shape (T per request, B, L per request) per bucket: what `kgen tune` times.
REPRESENTATIVE = {"decode": 1, "small": 16, "mid": 64, "large": 256}, {"1": 1, "2-8": 8, "9+": 32}, \
    {"short": 4096, "long": 32768, "longest": 131072}


def buckets() -> list[Bucket]:
    trees, batches, contexts = REPRESENTATIVE
    return [Bucket(t, b, c) for t in trees for b in batches for c in contexts]


def selected(prefixes: tuple[str, ...] = ()) -> list[Bucket]:
    """The buckets whose key starts with one of `prefixes` (all of them for none); an unknown prefix
    is an error that lists the keys."""
    every = buckets()
    for p in prefixes:
        if not any(b.key.startswith(p) for b in every):
            raise TuningError(f"no shape bucket's key starts with {p!r}; the keys are TREE/BATCH/CONTEXT: "
                              + ", ".join(b.key for b in every))
    return [b for b in every if not prefixes or b.key.startswith(prefixes)]


def shape_of(bucket: Bucket, max_nodes: int) -> tuple[int, int, int]:
    trees, batches, contexts = REPRESENTATIVE
    return min(trees[bucket.tree], max_nodes), batches[bucket.batch], contexts[bucket.context]


def parse_tiles(text: str) -> Tiles:
    tiles = designs.parse(text)
    if tiles is None:
        raise TuningError(f"tiles {text!r}: expected {designs.text_forms()}")
    return tiles


def candidates(spec: Spec, arch: Arch) -> list[Tiles]:
    """The tilings `kgen tune` tries on `arch`: each allowed design's candidates (kgen/designs/),
    those that plan within the arch's budgets."""
    out = []
    for t in (t for d in designs.allowed(arch) for t in d.candidates(spec, arch)):
        try:
            plan(spec, arch, tiles=t)
        except PlanError:
            continue
        out.append(t)
    return out


def spec_digest(spec: Spec) -> str:
    """What a table is tuned for: every field of the spec (its name included). A dense spec's unset
    model.index_topk is left out, so tables tuned before sparse specs existed keep their key."""
    fields = spec.model_dump(mode="json", exclude=None if spec.model.sparse else {"model": {"index_topk"}})
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def table_name(spec: Spec, arch: str) -> str:
    return f"{spec.name}-{spec_digest(spec)}-{arch}-{__version__}.json"


def user_dir() -> Path:
    return cache_root() / "tuned"


@dataclass(frozen=True)
class Choice:
    tiles: Tiles
    us: float  # its measured time on the bucket's shape
    default_us: float  # the heuristic plan's time there
    noise: float  # relative spread of repeated timings

    def row(self) -> dict:
        return {"tiles": designs.text(self.tiles), "us": round(self.us, 2), "default_us": round(self.default_us, 2),
                "noise": round(self.noise, 4)}


@dataclass(frozen=True)
class Table:
    spec: str
    digest: str
    arch: str
    version: str
    device: str
    choices: dict[str, Choice]  # bucket key -> choice
    path: Path | None = None

    def choice_for(self, bucket: Bucket) -> Choice | None:
        """The bucket's choice, else (a table from before its context class) the older bucket's."""
        c = self.choices.get(bucket.key)
        return c if c or not bucket.older else self.choices.get(bucket.older.key)

    def tiles_for(self, bucket: Bucket) -> Tiles | None:
        c = self.choice_for(bucket)
        return c.tiles if c else None

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "kgen_version": self.version, "spec": self.spec, "spec_digest": self.digest,
                "arch": self.arch, "device": self.device,
                "choices": {k: c.row() for k, c in sorted(self.choices.items())}}

    def save(self, path: Path) -> Path:
        """Write atomically (a reader never sees half a table)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


def read_table(path: Path) -> Table:
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA:
            raise TuningError(f"{path}: tuned-table schema {data.get('schema')!r}, this kgen reads {SCHEMA}")
        choices = {k: Choice(parse_tiles(c["tiles"]), float(c["us"]), float(c["default_us"]), float(c["noise"]))
                   for k, c in data["choices"].items()}
        return Table(data["spec"], data["spec_digest"], data["arch"], data["kgen_version"], data.get("device", ""),
                     choices, path)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise TuningError(f"{path}: not a kgen tuned table ({type(e).__name__}: {e})") from None


def find_table(spec: Spec, arch: str) -> Table | None:
    """The table for this spec (digest), arch and kgen version: the user's, else a shipped one."""
    name = table_name(spec, arch)
    for folder in (user_dir(), SHIPPED_DIR):
        path = folder / name
        if path.is_file():
            t = read_table(path)
            if (t.digest, t.arch, t.version) == (spec_digest(spec), arch, __version__):
                return t
    return None


def decide(times: dict[str, float], incumbent: str, noise: float) -> str:
    """The tiling a bucket keeps: the fastest of `times` (tiling text -> µs, one run) if it beats the
    incumbent (the table's previous choice, else the heuristic plan) by more than the measured
    noise and MIN_GAIN; otherwise the incumbent, so re-runs do not flip between near-equal tilings."""
    best = min(times, key=times.get)
    if incumbent not in times:
        return best
    return best if times[best] < times[incumbent] * (1 - max(MIN_GAIN, noise)) else incumbent
