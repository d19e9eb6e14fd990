"""Render a planned Variant into CUDA source with Jinja (StrictUndefined: a missing value is an
error, never an empty string). Templates inject values; loops and math stay in the .cuh headers.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

import jinja2

from .version import __version__
from .plan import Plan
from .signature import c_signature
from .variant import Variant


def templates_dir() -> Path:
    """templates/ beside the package in a checkout, or inside it in an installed wheel."""
    for candidate in (Path(__file__).parent.parent / "templates", Path(__file__).parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("kgen templates/ not found beside or inside the kgen package")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["c"] = c_literal
    return env


def c_literal(value: object) -> str:
    """A Python constant as a C literal: floats keep full precision, lists become initializers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value!r}f"
    if isinstance(value, (list, tuple)):
        return "{" + ", ".join(c_literal(v) for v in value) + "}"
    return str(value)


def headers() -> dict[str, str]:
    """Every NVRTC-safe header, by the name kernels include it with ("kgen/<file>")."""
    root = templates_dir()
    return {f"kgen/{p.name}": p.read_text() for p in sorted(root.glob("*.cuh"))}


_INCLUDE = re.compile(r'^\s*#\s*include\s+"(kgen/[^"]+)"', re.M)


def included_headers(source: str) -> dict[str, str]:
    """The headers `source` includes, directly or through other headers: what it compiles with (and
    what its cache key hashes). An include of a header that does not exist is left to NVRTC to report."""
    every, found, todo = headers(), {}, _INCLUDE.findall(source)
    while todo:
        name = todo.pop()
        if name in every and name not in found:
            found[name] = every[name]
            todo += _INCLUDE.findall(every[name])
    return dict(sorted(found.items()))


def render(variant: Variant) -> str:
    template = _env().get_template(variant.template)
    return template.render(
        symbol=variant.variant_id,
        threads=variant.threads,
        min_blocks=variant.min_blocks,
        signature=c_signature(variant.params),
        **variant.constants,
    )


def manifest(plan: Plan) -> dict:
    """What generated/<name>/manifest.json records: the spec, the budget and every variant."""
    return {
        "kgen_version": __version__,
        "spec": plan.spec.model_dump(mode="json"),
        "plan_arch": plan.arch.name,
        "tiles": {"design": plan.tiles.design, "bm": plan.tiles.bm, "bn": plan.tiles.bn,
                  "stages": plan.tiles.stages, "threads": plan.tiles.threads},
        "budget": plan.budget,
        # The sources include these headers from templates/; their hashes tie the golden to them.
        "headers": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in headers().items()},
        "variants": [
            {"kernel": v.kernel, "name": v.name, "variant_id": v.variant_id, "file": f"{v.name}.cu",
             "threads": v.threads, "smem_bytes": v.smem_bytes, "min_blocks": v.min_blocks,
             "params": [f"{p.ctype} {p.name}" for p in v.params]}
            for v in plan.variants
        ],
    }


def generated_files(plan: Plan) -> dict[str, str]:
    """Relative path -> text of everything in generated/<spec name>/."""
    files = {f"{v.name}.cu": render(v) for v in plan.variants}
    files["manifest.json"] = json.dumps(manifest(plan), indent=2, sort_keys=True) + "\n"
    return files


def write_generated(plan: Plan, out_root: Path) -> Path:
    """Write generated/<name>/, removing stale files so the folder is exactly the plan."""
    out = out_root / plan.spec.name
    files = generated_files(plan)
    if out.exists():
        for old in sorted(out.rglob("*"), reverse=True):
            rel = old.relative_to(out).as_posix()
            if old.is_file() and rel not in files:
                old.unlink()
            elif old.is_dir() and not any(old.iterdir()):
                old.rmdir()
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return out
