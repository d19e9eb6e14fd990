"""Timing of SGLang's DSA pool rows (issue 20): verify and decode on page-64 bf16 rows and on the
656-byte fp8 rows with per-block scales, next to today's bf16 page-1 verify, on the same shapes,
with the same method as bench/run.py (CUDA-graph replay of K rotated input sets, median / K).

    python -m bench.dsa_rows [--plan-arch sm_120] [--bf16-tiles seesaw:32,4,1] [--fp8-tiles wgmma:32,3,1]
                             [--dsa-tiles wgmma:32,2,1] [--out DIR]

Prints one table and writes dsa_rows-<device>-<plan>.json to --out (default bench/results).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import yaml

import kgen
from kgen import designs
from kgen.spec import parse_spec
from kgen.inputs import make_verify_inputs
from kgen.timing import time_rotation

ROOT = Path(__file__).resolve().parents[1]
# --formats key -> (label, shipped spec, cache fields changed)
FORMATS = {"bf16p1": ("bf16 page 1", "glm5_sm120", {}),
           "bf16p64": ("bf16 page 64", "glm5_sm120", {"page_size": 64}),
           "fp8": ("fp8 per-tensor page 64", "glm5_fp8_sm120", {"page_size": 64}),  # the same loop without block scales
           "dsa": ("fp8 656-B rows page 64", "glm5_dsa_fp8_sm120", {})}
SHAPES = [(1, 131072, 16), (1, 32768, 16), (8, 32768, 64), (1, 4096, 16), (32, 32768, 1), (1, 131072, 1)]  # B, L, T
L2_ROTATIONS = 4  # the rotated sets' KV together is about this many times L2 (bench/run.py's rule)


def spec_of(name: str, cache: dict):
    data = yaml.safe_load((ROOT / "specs" / f"{name}.yaml").read_text())
    data["cache"].update(cache)
    data["name"] = f"{name}_p{data['cache']['page_size']}"
    return parse_spec(data, f"{name}.yaml with {cache}")


def time_shape(mod, b: int, length: int, t: int, device) -> float:
    first = make_verify_inputs(mod.spec, [t] * b, [length] * b, device=device)
    kv_bytes = first.kv_cache.numel() * first.kv_cache.element_size()
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (60 << 20)
    sets = [first] + [make_verify_inputs(mod.spec, [t] * b, [length] * b, device=device)
                      for _ in range(max(1, math.ceil(L2_ROTATIONS * l2 / kv_bytes)) - 1)]
    outs = [x.outputs() for x in sets]
    if t == 1:  # decode: the prefix op (a request's one new token against its prefix)
        calls = [lambda x=x, o=o: mod.prefix_attention(*x.prefix_args(), out=o[0], lse=o[1]) for x, o in zip(sets, outs)]
    else:
        # the tree keys as the pool stores them, as a server passes them (VerifyInputs.stored_k_tree)
        calls = [lambda a=x.verify_args(stored_tree=True), o=o: mod.verify_attention(*a, out=o[0], lse=o[1])
                 for x, o in zip(sets, outs)]
    us = time_rotation(calls)
    del sets, outs
    torch.cuda.empty_cache()
    return us


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dsa_rows", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan-arch", default=None, help="run this arch's plan (e.g. sm_120 on an H200)")
    p.add_argument("--bf16-tiles", default=None, help="the bf16 formats' tiling (e.g. seesaw:32,4,1)")
    p.add_argument("--fp8-tiles", default=None,
                   help="the per-tensor fp8 format's tiling (e.g. wgmma:32,3,1: the wgmma loop over fp8 rows, "
                        "a candidate)")
    p.add_argument("--dsa-tiles", default=None, help="the 656-B rows' tiling (e.g. wgmma:32,2,1)")
    p.add_argument("--formats", default=",".join(FORMATS),
                   help=f"only these formats, comma-separated (default: all of {', '.join(FORMATS)})")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    tiling = {}
    for flag, text in (("--bf16-tiles", args.bf16_tiles), ("--fp8-tiles", args.fp8_tiles), ("--dsa-tiles", args.dsa_tiles)):
        tiling[flag] = designs.parse(text) if text else None
        if text and tiling[flag] is None:
            p.error(f"{flag} {text!r} is not a tiling ({designs.text_forms()})")
    formats = args.formats.split(",")
    if unknown := [f for f in formats if f not in FORMATS]:
        p.error(f"--formats: unknown {', '.join(unknown)} (known: {', '.join(FORMATS)})")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    rows = []
    for label, spec_name, cache in (FORMATS[f] for f in formats):
        spec = spec_of(spec_name, cache)
        fp8 = spec.cache.kv_dtype != "bfloat16"
        tiles = tiling["--dsa-tiles" if spec.cache.per_block else "--fp8-tiles"] if fp8 else tiling["--bf16-tiles"]
        mod = kgen.jit(spec, arch=args.plan_arch, tiles=tiles)
        for b, length, t in SHAPES:
            us = time_shape(mod, b, length, t, device)
            rows.append({"format": label, "spec": mod.spec.name, "plan": mod.plan.tiles.design,
                         "tiles": designs.text(mod.plan.tiles), "plan_arch": mod.plan.arch.name, "B": b, "L": length, "T": t, "H": 8, "us": us})
            print(f"{label:24s} {mod.plan.arch.name}/{mod.plan.tiles.design:8s} B={b:<3d} L={length:<7d} T={t:<3d} "
                  f"{us:9.1f} us", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "".join(f"-{what}_{text.replace(':', '_').replace(',', '_')}"
                  for what, text in (("bf16", args.bf16_tiles), ("fp8", args.fp8_tiles), ("dsa", args.dsa_tiles)) if text)
    path = args.out / f"dsa_rows-{name.replace(' ', '_')}-{args.plan_arch or 'own'}{tag}.json"
    path.write_text(json.dumps({"device": name, "plan_arch": args.plan_arch, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
