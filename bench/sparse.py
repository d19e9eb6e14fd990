"""Sparse (DSA) tree verify benchmark (DESIGN §12): kgen's union kernel, its per-token-gather
variant (the internal baseline) and, where bench/peers.py provides it, FlashMLA's sparse decode
with heads padded to 64 (what SGLang runs on Hopper), on the same indexer-shaped lists.

    python -m bench.sparse [--spec specs/glm5_dsa_sm120.yaml] [--plan-arch sm_120] [--check] [--out DIR]
                           [--shapes 0,1 | --shape B,L,T,SHARED ...]

Lists per request (kgen/sparse_testing.py): attention sinks, a recent window and common picks that
every tree token lists (`shared` of K), plus each token's own picks; the union size is reported.
Timing is CUDA-graph replay over rotated input sets (kgen/timing.py); tree keys are passed as the
cache stores them, as a server does (VerifyInputs.stored_k_tree). floor = max(union rows x row
bytes / copy bandwidth, FLOPs of the listed keys / mma rate), FLOPs = 2 * sum_i H * (K'_i + T) * (D + Dv).
`rows x`: the KV rows the gather reads over those the union reads, at the kernels' row tiles
(SparseInputs.tile_rows): what `x` (union us against gather us) can reach where a row costs both alike.
--check first compares both kernels with the float64 reference on every shape's first set.
Writes <out>/sparse-<spec>-<time>.json after every shape.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import torch

from kgen import kvrows

# (B, L, T, shared fraction): the shapes, then overlap and batch sweeps
SHAPES = ((1, 131072, 16, 0.7), (8, 131072, 16, 0.7), (32, 32768, 16, 0.7), (1, 131072, 1, 0.7),
          (1, 131072, 64, 0.5), (1, 131072, 16, 0.0), (1, 131072, 16, 0.9), (8, 32768, 16, 0.5),
          (1, 4096, 16, 0.7), (64, 8192, 16, 0.7), (2, 131072, 16, 0.7), (4, 131072, 16, 0.7))
L2_ROTATIONS = 4
MAX_SETS = 16


def flashmla_calls(inputs) -> tuple[list | None, str | None]:
    """FlashMLA's sparse decode on each input set, heads padded to 64: (calls, note). The peer is
    bench/peers.py's sparse_decode (the `peers` branch); it reads the DSA pool's 656-byte fp8 rows,
    so a spec with other rows gets a pool of random 656-byte rows with the same slots (the same
    lists and work, fewer bytes per row than a bf16 cache: said in the note)."""
    from kgen.fp8 import quantize_rows
    try:
        from .peers import sparse_decode
    except ImportError:
        return None, "FlashMLA sparse: bench/peers.py has no sparse_decode here"
    note = None
    calls = []
    try:
        for x in inputs:
            b = x.base
            cache = b.kv_cache
            if cache.dtype != torch.uint8:
                g = torch.Generator(cache.device).manual_seed(len(calls))
                rows = torch.randn(cache.shape[0], 576, generator=g, device=cache.device).to(torch.bfloat16)
                cache = quantize_rows(rows, 512)
                note = "FlashMLA sparse on 656-B fp8 rows of the same slots"
            calls.append(sparse_decode(b.q, cache, x.topk_indices, scale=b.scale, value_dim=b.value_dim))
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is a note, never a failure
        return None, f"FlashMLA sparse: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return calls, note


def measure(mod, shape, ceilings, bm: int, *, check: bool, device) -> dict:
    from kgen.sparse_testing import make_sparse_inputs
    from kgen.accuracy import assert_close_attention, tolerances
    from kgen.timing import time_rotation

    b, length, t, shared = shape
    spec = mod.spec
    width, h = spec.model.index_topk, spec.model.num_q_heads
    row_bytes = kvrows.row_bytes(spec)
    row = dict(B=b, L=length, T=t, H=h, K=width, shared=shared, notes=[])
    first = make_sparse_inputs(spec, [t] * b, [length] * b, width, shared=shared, window=256, device=device)
    unions = first.union_sizes()
    row["union_per_request"] = sum(unions) / b
    row["union_fraction"] = sum(unions) / max(1, b * t * min(width, length))
    row["rows_union"], row["rows_gather"] = first.tile_rows(h, bm)
    row["rows_ratio"] = row["rows_gather"] / max(1, row["rows_union"])
    read = sum(unions) * row_bytes
    listed = int((first.topk_indices >= 0).sum())
    flops = 2 * h * (listed + b * t * t) * (spec.model.head_dim + spec.model.value_dim)
    row["floor_us"] = 1e6 * max(read / (ceilings.copy_tbps * 1e12), flops / (ceilings.mma_tflops * 1e12))
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (60 << 20)
    sets = min(MAX_SETS, max(2, math.ceil(L2_ROTATIONS * l2 / max(read, 1))))
    per_set = first.base.kv_cache.numel() * first.base.kv_cache.element_size()
    sets = max(1, min(sets, (torch.cuda.mem_get_info(device)[0] - (4 << 30)) // max(per_set, 1)))
    inputs = [first] + [make_sparse_inputs(spec, [t] * b, [length] * b, width, shared=shared, window=256,
                                           device=device) for _ in range(sets - 1)]
    row["sets"] = sets
    # the kernel prepare_sparse runs when its caller does not choose (kgen/sparse.py prefers_union)
    row["default"] = "union" if mod.prepare_sparse(first.base.qo_indptr, first.topk_indices,
                                                    first.base.op_mask).union else "gather"
    for name, union in (("union", True), ("gather", False)):
        # one workspace for every set's step, as a server's layers share their batch's (bench.run's calls)
        workspace = torch.empty(mod.sparse_workspace_bytes(first.base.q.shape[0], b, union), dtype=torch.uint8,
                                device=device)
        steps = [mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask, union=union,
                                    workspace=workspace) for x in inputs]
        outs = [x.base.outputs() for x in inputs]
        if check:
            s, x, (o, lse) = steps[0], inputs[0], outs[0]
            s.verify(x.base.q, x.base.kv_cache, x.base.k_tree, **x.base.kv_kwargs, out=o, lse=lse)
            try:
                assert_close_attention(o, lse, *x.ref(), **tolerances(spec), what=f"{name} {shape}")
                row[f"{name}_check"] = "ok"
            except AssertionError as e:
                row[f"{name}_check"] = str(e).splitlines()[0]
        calls = [lambda s=s, x=x, o=o, k=x.base.stored_k_tree: s.verify(x.base.q, x.base.kv_cache, k, **x.base.kv_kwargs,
                                                                      out=o[0], lse=o[1])
                 for s, x, o in zip(steps, inputs, outs)]
        row[f"us_{name}"] = time_rotation(calls)
        del steps, outs, calls
    peers, note = flashmla_calls(inputs)
    if peers is not None:
        row["us_flashmla_sparse"] = time_rotation(peers)
        row["union_vs_flashmla"] = row["us_flashmla_sparse"] / row["us_union"]
    if note:
        row["notes"].append(note)
    del peers
    row["pct_floor"] = 100 * row["floor_us"] / row["us_union"]
    row["union_vs_gather"] = row["us_gather"] / row["us_union"]
    del inputs, first
    torch.cuda.empty_cache()
    return row


def anatomy(mod, shape, *, device) -> dict:
    """Where a call's time goes (graph replay, µs): each kernel on the indexer-shaped lists, on lists
    of -1 only (the union kernel still scans every entry; neither attends a key: the tree and the
    fixed costs remain), and on lists every token of a request shares whole (shared = 1)."""
    from kgen.sparse_testing import make_sparse_inputs
    from kgen.timing import time_rotation

    b, length, t, shared = shape
    width = mod.spec.model.index_topk

    def sets(fraction):
        return [make_sparse_inputs(mod.spec, [t] * b, [length] * b, width, shared=fraction, window=256,
                                   device=device) for _ in range(8)]

    real = sets(shared)
    variants = {"real": [(x, x.topk_indices) for x in real],
                "none": [(x, torch.full_like(x.topk_indices, -1)) for x in real],
                "all shared": [(x, x.topk_indices) for x in sets(1.0)]}
    row = {"shape": list(shape)}
    for what, inputs in variants.items():
        for name, union in (("union", True), ("gather", False)):
            workspace = torch.empty(mod.sparse_workspace_bytes(real[0].base.q.shape[0], b, union), dtype=torch.uint8,
                                    device=device)
            steps = [mod.prepare_sparse(x.base.qo_indptr, k, x.base.op_mask, union=union, workspace=workspace)
                     for x, k in inputs]
            outs = [x.base.outputs() for x, _ in inputs]
            row[f"{name} {what}"] = round(time_rotation(
                [lambda s=s, x=x, o=o, k=x.base.stored_k_tree: s.verify(x.base.q, x.base.kv_cache, k,
                                                                         **x.base.kv_kwargs, out=o[0], lse=o[1])
                 for s, (x, _), o in zip(steps, inputs, outs)]), 1)
    return row


def parse_shape(text: str) -> tuple[int, int, int, float]:
    """--shape B,L,T,SHARED."""
    try:
        b, length, t, shared = text.split(",")
        shape = int(b), int(length), int(t), float(shared)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not B,L,T,SHARED (e.g. 1,131072,32,0.5)") from None
    if min(shape[:3]) < 1 or not 0 <= shape[3] <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: B, L and T are at least 1 and SHARED is a fraction")
    return shape


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="specs/glm5_dsa_sm120.yaml")
    p.add_argument("--plan-arch", default=None, help="run another arch's plan (sm_120 on an H200)")
    p.add_argument("--check", action="store_true", help="compare with the reference first (slower)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--time-limit", type=float, default=None, help="start no new shape after this many seconds")
    p.add_argument("--anatomy", action="store_true", help="only the time breakdown of the first shapes")
    p.add_argument("--tiles", default=None, help="an mma.sync tiling for the sparse kernels instead of the plan's "
                                                 "(e.g. mma_sync:32,32,2,8,1)")
    p.add_argument("--shapes", default=None, help="comma-separated indices into SHAPES (default: all)")
    p.add_argument("--shape", action="append", type=parse_shape, default=[], metavar="B,L,T,SHARED",
                   help="a shape of its own instead of SHAPES (repeatable), e.g. 1,131072,32,0.5")
    a = p.parse_args(argv)
    if a.shape and a.shapes:
        p.error("--shape and --shapes: give one or the other")
    import kgen
    from kgen import designs
    from kgen.sparse_plan import sparse_tiles
    from kgen.variant import PlanContext

    from .ceilings import measure as measure_ceilings

    if not torch.cuda.is_available():
        print("error: bench.sparse needs a CUDA GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    start = time.perf_counter()
    tiles = designs.parse(a.tiles) if a.tiles else None
    if a.tiles and tiles is None:
        p.error(f"--tiles {a.tiles!r} is not a tiling ({designs.text_forms()})")
    mod = kgen.jit(kgen.load_spec(a.spec), arch=a.plan_arch, tiles=tiles)
    used = sparse_tiles(PlanContext(mod.spec, mod.plan.arch, mod.plan.tiles, ""))
    if tiles and not (isinstance(tiles, designs.MmaSyncTiles) and replace(tiles, q_apart=used.q_apart) == used):
        p.error(f"--tiles {a.tiles!r}: the sparse kernels run {used} instead (kgen/sparse_plan.py sparse_tiles)")
    shapes = a.shape or ([SHAPES[int(i)] for i in a.shapes.split(",")] if a.shapes else SHAPES)
    ceilings = measure_ceilings(device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sparse-{mod.spec.name}-{mod.plan.arch.name}-{datetime.now():%Y%m%d-%H%M%S}.json"
    result = {"spec": mod.spec.name, "plan_arch": mod.plan.arch.name, "tiles": a.tiles, "device": torch.cuda.get_device_name(device),
              "ceilings": ceilings.as_dict(), "rows": []}
    print(f"{mod.spec.name} on {result['device']} (plan {mod.plan.arch.name}): copy {ceilings.copy_tbps:.2f} TB/s, "
          f"mma {ceilings.mma_tflops:.0f} TFLOP/s")
    print(f"{'B':>3} {'L':>7} {'T':>3} {'shared':>6} {'union':>7} {'floor':>7} {'union us':>9} {'gather us':>9} "
          f"{'x':>5} {'rows x':>6} {'%floor':>6} {'FlashMLA':>9} {'default':>7}  notes")
    if a.anatomy:
        for shape in SHAPES[:2]:
            r = anatomy(mod, shape, device=device)
            result.setdefault("anatomy", []).append(r)
            path.write_text(json.dumps(result, indent=2))
            print(r, flush=True)
        print(f"wrote {path}")
        return 0
    for shape in shapes:
        if a.time_limit and time.perf_counter() - start > a.time_limit:
            result.setdefault("skipped", []).append(list(shape))
            continue
        try:
            r = measure(mod, shape, ceilings, used.bm, check=a.check, device=device)
        except torch.cuda.OutOfMemoryError as e:
            r = dict(zip(("B", "L", "T", "shared"), shape), notes=[f"out of memory: {str(e).splitlines()[0]}"])
            torch.cuda.empty_cache()
        result["rows"].append(r)
        path.write_text(json.dumps(result, indent=2))
        if "us_union" not in r:
            print(f"{shape}: {r['notes']}")
            continue
        checks = " ".join(f"{k}={r[k]}" for k in ("union_check", "gather_check") if k in r)
        flashmla = f"{r['us_flashmla_sparse']:.1f}" if "us_flashmla_sparse" in r else "-"
        print(f"{r['B']:>3} {r['L']:>7} {r['T']:>3} {r['shared']:>6} {r['union_per_request']:>7.0f} "
              f"{r['floor_us']:>7.1f} {r['us_union']:>9.1f} {r['us_gather']:>9.1f} {r['union_vs_gather']:>5.2f} "
              f"{r['rows_ratio']:>6.2f} {r['pct_floor']:>6.1f} {flashmla:>9} {r['default']:>7}  {checks} {'; '.join(r['notes'])}", flush=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
