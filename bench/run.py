"""kgen's benchmark (DESIGN §9): ceilings, the GLM-5 shape grid, SGLang's Triton baseline and
the public MLA kernels (FlashInfer, FlashMLA: bench/peers.py).

    python -m bench.run --spec specs/glm5_sm120.yaml [--quick] [--page-size 64] [--peers auto]
    kgen bench specs/glm5_sm120.yaml [--quick]

In one process on one GPU:
1. measures the copy bandwidth, the mma.sync bf16 rate and the dense GEMM rate (bench/ceilings.py);
2. checks kgen's verify_attention against SGLang's Triton extend_attention_fwd (and the float64
   torch reference, timed there) on one small ragged shape: relative L2 of o must be <= 1e-2;
   and each peer against the reference on a chain tree (what a causal mask computes), so the
   times compare equal work; a peer off by more than 1e-2 is not timed;
3. times, for every shape of the grid, verify_attention and its halves prefix_attention and
   tree_attention (--no-halves: verify alone), the Triton baseline and the peers on the same
   inputs (kgen/timing.py: CUDA-graph replay over K rotated input sets, so no call reads KV that
   is still in L2); decode rows (T = 1) time prefix_attention alone (SGLang decodes with a
   different Triton kernel: no baseline there; the peers attend to the prefix alone);
4. prints a table and writes bench/results/<spec>-<time>.json (rewritten after every shape, so a
   cut-short run keeps what it measured; {ceilings, cross_check, peers, rows, skipped}: every row
   in "rows" has its times, shapes that could not run are in "skipped" with the reason) and a PNG
   plot next to it.

floor = max(KV bytes read once / copy bandwidth, FLOPs / mma rate), with KV bytes =
B * (L + T) * 1152 and FLOPs = 2 * B * T * H * (L + T) * (576 + 512) (decode: L instead of L + T);
% of floor = floor / time. The GEMM floor puts the dense GEMM rate in place of the mma rate.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from kgen import kvrows

RESULTS = Path(__file__).resolve().parent / "results"
HEADS = (8, 16)
TREES = (16, 64, 256)
CONTEXTS = (4096, 32768, 131072)
BATCHES = (1, 8, 32)
QUICK = ((16, 4096, 1), (16, 131072, 1), (64, 32768, 8), (1, 32768, 8))  # (T, L, B); T = 1 is decode
# issue 19's table, (B, L, T, H): kgen against FlashInfer and FlashMLA
ISSUE19 = ((1, 131072, 16, 8), (1, 131072, 16, 16), (1, 32768, 16, 8), (8, 32768, 64, 8), (32, 4096, 16, 8),
           (1, 131072, 1, 8), (32, 131072, 1, 8), (16, 32768, 33, 16), (1, 4096, 16, 8), (1, 8192, 16, 8),
           (4, 8192, 16, 8))
PRESETS = {"issue19": ISSUE19}
CHECK_SHAPE = ([16, 16, 16], [1000, 4097, 77])  # cross-check: tree sizes, prefix lengths (ragged)
L2_ROTATIONS = 4  # rotated sets hold at least this many L2 sizes of KV
MAX_SETS = 32
RESERVE_BYTES = 4 << 30  # left free for kgen's and Triton's workspaces


class BenchError(RuntimeError):
    """A reason the benchmark cannot run at all; printed as one line."""


@dataclass(frozen=True)
class Shape:
    H: int
    T: int  # tree tokens per request; 1 = a decode row (prefix_attention only)
    L: int
    B: int
    P: int

    @property
    def decode(self) -> bool:
        return self.T == 1

    def label(self) -> str:
        return f"H={self.H} T={self.T} L={self.L} B={self.B} P={self.P}"


# ---- shapes, specs, floors --------------------------------------------------------------------


def grid(spec, *, quick: bool, page_size: int, heads, trees, contexts, batches, decode: bool,
         shapes=None) -> list[Shape]:
    """The shapes to run: the quick set and/or `shapes` ((B, L, T, H) tuples) when either is asked
    for, else the product of heads, trees, contexts and batches (plus decode rows)."""
    if quick or shapes:
        picked = [Shape(spec.model.num_q_heads, t, l, b, page_size) for t, l, b in QUICK] if quick else []
        picked += [s for b, l, t, h in shapes or () if (s := Shape(h, t, l, b, page_size)) not in picked]
        return [s for s in picked if decode or not s.decode]
    shapes = [Shape(h, t, l, b, page_size) for h in heads for t in trees for l in contexts for b in batches]
    if decode:
        shapes += [Shape(h, 1, l, b, page_size) for h in heads for l in contexts for b in batches]
    return shapes


def spec_for(base, heads: int, tree: int, page_size: int):
    """The base spec with this head count and page size, and max_nodes raised (to the next
    power of two) only when the tree does not fit the base's."""
    from kgen.spec import MAX_TREE_NODES, parse_spec

    nodes = base.tree.nodes if tree <= base.tree.nodes else min(MAX_TREE_NODES, 1 << (tree - 1).bit_length())
    if (heads, nodes, page_size) == (base.model.num_q_heads, base.tree.nodes, base.cache.page_size):
        return base
    data = base.model_dump()
    data["name"] = f"{base.name}_h{heads}_n{nodes}_p{page_size}"[:64]
    data["model"]["num_q_heads"] = heads
    data["cache"]["page_size"] = page_size
    data["tree"] = {"max_nodes": nodes}
    return parse_spec(data, f"{base.name} (bench: H={heads}, max_nodes={nodes}, page_size={page_size})")


def work(shape: Shape, spec) -> tuple[int, int]:
    """(KV bytes read once, FLOPs) of one call."""
    m = spec.model
    row = kvrows.row_bytes(spec)
    keys = shape.L if shape.decode else shape.L + shape.T
    return shape.B * keys * row, 2 * shape.B * shape.T * shape.H * keys * (m.head_dim + m.value_dim)


def pool_pages(prefix_lens: list[int], tree_sizes: list[int], page_size: int, peers: bool) -> int:
    """Pages of an input set's pool: make_verify_inputs' default, plus room for the peers' tree tokens."""
    from .peers import extra_pages

    used = sum(math.ceil(n / page_size) for n in prefix_lens)
    return used + max(2, used // 4) + (extra_pages(tree_sizes, page_size) if peers else 0)


def set_bytes(shape: Shape, spec, triton: bool) -> tuple[int, int]:
    """(bytes of one input set with its outputs and Triton's extra inputs, KV bytes a call reads)."""
    m = spec.model
    row = kvrows.row_bytes(spec)
    pages = math.ceil(shape.L / shape.P) * shape.B
    pool = (pages + max(2, pages // 4)) * shape.P * row
    tokens = shape.B * shape.T
    qo = tokens * shape.H * (m.head_dim + m.value_dim) * 2 + tokens * row
    temp = shape.B * shape.L * 8 * 3  # make_verify_inputs' slot arithmetic (freed after)
    extra = shape.B * shape.T * (shape.L + shape.T) + shape.B * shape.L * 8 + qo if triton and not shape.decode else 0
    work_buf = (2 * tokens * shape.H + 256 * 64) * m.value_dim * 4  # kgen's partial states
    return pool + qo + temp + extra + work_buf, shape.B * shape.L * row + qo


# ---- measuring ----------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:200]


def _sticky(e: BaseException) -> bool:
    """A CUDA error that poisons the context: nothing after it can be trusted."""
    text = str(e).lower()
    return any(s in text for s in ("illegal", "misaligned", "unspecified launch failure", "device-side assert"))


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300)).item()


def lse_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    fin = torch.isfinite(b)
    if not torch.equal(fin, torch.isfinite(a)):
        return math.inf
    return ((a[fin] - b[fin]).abs() / (b[fin].abs() + 1)).max().item() if fin.any() else 0.0


def cross_check(mod, fwd, spec, page_size: int, device) -> dict:
    """kgen verify vs Triton (and both vs the float64 reference) on one small ragged shape."""
    from kgen.inputs import make_verify_inputs
    from kgen.accuracy import tolerances

    from .baseline import TritonVerify

    trees, lens = CHECK_SHAPE
    x = make_verify_inputs(spec, trees, lens, page_size=page_size, device=device)
    o, lse = x.outputs()
    mod.verify_attention(*x.verify_args(), **x.kv_kwargs, out=o, lse=lse)
    res = dict(H=spec.model.num_q_heads, T=trees, L=lens, page_size=page_size)
    o_tol = tolerances(spec).get("o_tol", 1e-2)
    if fwd is not None:
        to, tlse = TritonVerify(fwd, x, with_lse=True)()
    torch.cuda.synchronize()
    start = time.perf_counter()
    ro, rlse = x.verify_ref()
    torch.cuda.synchronize()
    res["ref_ms"] = (time.perf_counter() - start) * 1e3
    res["kgen_vs_ref"] = rel_l2(o, ro)
    res["kgen_lse_vs_ref"] = lse_err(lse, rlse)
    if fwd is not None:
        res["kgen_vs_triton"] = rel_l2(o, to)
        res["kgen_lse_vs_triton"] = lse_err(lse, tlse)
        res["triton_vs_ref"] = rel_l2(to, ro)
        res["ok"] = res["kgen_vs_triton"] <= 1e-2 and res["kgen_vs_ref"] <= 1e-2
    else:
        res["ok"] = res["kgen_vs_ref"] <= o_tol
    return res


PEER_TOL = 1e-2  # a peer's o against the float64 reference on a chain (bf16 outputs)


def peer_check(mod, names, spec, page_size: int, device, workspace) -> dict:
    """kgen and each peer against the float64 reference on one small chain-tree shape (a causal
    mask: what the peers compute), so their times compare equal work, and the peers on decode rows
    of the same prefixes (T = 1, the prefix alone). Per peer: relative L2 of o against the
    reference (verify, decode) and against kgen, and ok (both <= PEER_TOL), or the error it raised."""
    from kgen.inputs import make_verify_inputs

    from .peers import chain_kv, prepare

    trees, lens = CHECK_SHAPE
    x = make_verify_inputs(spec, trees, lens, page_size=page_size, tree_kind="chain", device=device,
                           num_pages=pool_pages(lens, trees, page_size, True))
    d = make_verify_inputs(spec, [1] * len(lens), lens, page_size=page_size, device=device)
    o, lse = x.outputs()
    mod.verify_attention(*x.verify_args(), **x.kv_kwargs, out=o, lse=lse)
    ro, _ = x.verify_ref()
    rd, _ = d.prefix_ref()
    res = dict(H=spec.model.num_q_heads, T=trees, L=lens, page_size=page_size, tree="chain",
               kgen_vs_ref=rel_l2(o, ro), peers={})
    kv, kv_decode = chain_kv(x), chain_kv(d, with_tree=False)
    for name in names:
        try:
            po = prepare(name, x, kv, workspace)()
            pd = prepare(name, d, kv_decode, workspace)()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a peer that fails is skipped, not the benchmark
            if _sticky(e):
                raise
            res["peers"][name] = dict(ok=False, error=_first_line(e))
            continue
        err, err_decode = rel_l2(po, ro), rel_l2(pd, rd)
        res["peers"][name] = dict(vs_ref=err, vs_ref_decode=err_decode, vs_kgen=rel_l2(po, o),
                                  ok=max(err, err_decode) <= PEER_TOL)
    return res


def floors(kv_bytes: int, flops: int, ceilings) -> tuple[float, float, float]:
    """(floor with the mma.sync rate, floor with the GEMM rate, memory part) in seconds."""
    mem = kv_bytes / (ceilings.copy_tbps * 1e12)
    return max(mem, flops / (ceilings.mma_tflops * 1e12)), max(mem, flops / (ceilings.gemm_tflops * 1e12)), mem


def measure_shape(shape: Shape, spec, mod, fwd, ceilings, *, graph: bool, sets: int | None, device,
                  base_name: str, peers=(), flashinfer: str = "flashinfer_fa2", workspace=None,
                  halves: bool = True, one_shot: bool = False) -> dict:
    """One row: kgen's three ops (verify alone without `halves`), Triton and `peers` on K rotated
    input sets of `shape`; "x FlashInfer" compares with peer `flashinfer`. one_shot: kgen's one-shot
    ops rather than prepared steps' calls (no schedule tables: the kernels find their own items)."""
    from kgen.inputs import make_verify_inputs

    from .baseline import TritonVerify
    from .peers import LABELS, PEERS, chain_kv, prepare
    from kgen.timing import time_rotation

    kv_bytes, flops = work(shape, spec)
    floor_s, floor_gemm_s, mem_s = floors(kv_bytes, flops, ceilings)
    row = dict(spec=spec.name, base_spec=base_name, H=shape.H, T=shape.T, L=shape.L, B=shape.B, page_size=shape.P,
               mode="decode" if shape.decode else "verify", us=None, us_prefix=None, us_tree=None, us_triton=None,
               **{f"us_{p}": None for p in PEERS}, tflops=None, kv_tbps=None, floor_us=floor_s * 1e6,
               floor_gemm_us=floor_gemm_s * 1e6, pct_floor=None, pct_floor_gemm=None, speedup_vs_triton=None,
               speedup_vs_flashinfer=None, speedup_vs_flashmla=None, flashinfer_peer=flashinfer,
               bound="memory" if mem_s >= floor_s else "compute", sets=0, notes=[])

    one, kv_read = set_bytes(shape, spec, fwd is not None)
    free = torch.cuda.mem_get_info(device)[0] - RESERVE_BYTES
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (60 << 20)
    k = sets or min(MAX_SETS, max(2, math.ceil(L2_ROTATIONS * l2 / kv_read)))
    k = min(k, free // one)
    if k < 1:
        row["notes"].append(f"skipped: one input set needs {one / 2**30:.1f} GiB, {max(free, 0) / 2**30:.1f} GiB free")
        return row
    if k == 1:
        row["notes"].append("1 input set (only one fits; its KV is far larger than L2)")
    row["sets"] = k

    trees, lens = [shape.T] * shape.B, [shape.L] * shape.B
    inputs = [make_verify_inputs(spec, trees, lens, page_size=shape.P, device=device,
                                 num_pages=pool_pages(lens, trees, shape.P, bool(peers))) for _ in range(k)]
    outs = [x.outputs() for x in inputs]

    def calls(op):
        """A layer's call of each input set's prepared step, as a server runs them (the step, and its
        schedule tables, made once per batch; a call per layer); tree keys as the cache stores them,
        as a server passes an fp8 op (VerifyInputs.stored_k_tree). The sets' steps share one
        workspace, as a server's layers share their batch's step (and as the peers share theirs): the
        partial states of one call are written over the previous call's."""
        rows = inputs[0].q.shape[0]
        workspace = torch.empty(mod.workspace_bytes(rows, shape.B), dtype=torch.uint8, device=device)
        steps = [mod._one_call(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.op_mask, num_tokens=rows,
                               workspace=workspace) if one_shot else
                 mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.op_mask, num_tokens=rows,
                             workspace=workspace)
                 for x in inputs]
        if op == "verify":
            return [lambda s=s, x=x, k=x.stored_k_tree, o=o: s.verify(x.q, x.kv_cache, k, **x.kv_kwargs, out=o[0],
                                                                      lse=o[1])
                    for s, x, o in zip(steps, inputs, outs)]
        if op == "prefix":
            return [lambda s=s, x=x, o=o: s.prefix(x.q, x.kv_cache, **x.kv_kwargs, out=o[0], lse=o[1])
                    for s, x, o in zip(steps, inputs, outs)]
        return [lambda s=s, x=x, k=x.stored_k_tree, o=o: s.tree(x.q, k, **x.kv_kwargs, out=o[0], lse=o[1])
                for s, x, o in zip(steps, inputs, outs)]

    def timed(fns, what: str) -> float:
        """Graph-replay time; if capturing fails (and the context survives), the eager time."""
        try:
            return time_rotation(fns, graph=graph)
        except Exception as e:  # noqa: BLE001
            if not graph or _sticky(e):
                raise
            row["notes"].append(f"{what} timed eagerly, capture failed: {_first_line(e)}")
            return time_rotation(fns, graph=False)

    ops = ["prefix"] if shape.decode else ["verify", "prefix", "tree"] if halves else ["verify"]
    try:
        for op in ops:
            row["us" if op == "verify" else f"us_{op}"] = timed(calls(op), op)
        if shape.decode:
            row["us"] = row["us_prefix"]
        if fwd is not None and not shape.decode:
            triton_calls = [TritonVerify(fwd, x) for x in inputs]
            row["us_triton"] = timed(triton_calls, "triton")
            del triton_calls
        chains = [chain_kv(x, with_tree=not shape.decode) for x in inputs] if peers else []
        for name in peers:
            try:
                row[f"us_{name}"] = timed([prepare(name, x, kv, workspace) for x, kv in zip(inputs, chains)], name)
            except Exception as e:  # noqa: BLE001 - a peer that fails loses its cell, not the row
                if _sticky(e):
                    raise
                row["notes"].append(f"{LABELS[name]}: {_first_line(e)}")
    except Exception as e:  # noqa: BLE001 - one failing shape must not lose the others
        row["notes"].append(_first_line(e))
        if _sticky(e):
            raise
    finally:
        del inputs, outs
        torch.cuda.empty_cache()

    if row["us"]:
        us = row["us"]
        row["tflops"] = flops / (us * 1e-6) / 1e12
        row["kv_tbps"] = kv_bytes / (us * 1e-6) / 1e12
        row["pct_floor"] = 100.0 * row["floor_us"] / us
        row["pct_floor_gemm"] = 100.0 * row["floor_gemm_us"] / us
        for key, peer_us in (("triton", row["us_triton"]), ("flashinfer", row[f"us_{flashinfer}"]),
                             ("flashmla", row["us_flashmla"])):
            if peer_us:
                row[f"speedup_vs_{key}"] = peer_us / us
    return row


# ---- reporting ----------------------------------------------------------------------------------


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _ratio_columns(peers) -> list[tuple[str, str]]:
    """(column, row key) of the peer ratios a run has: x FlashInfer, x FlashMLA."""
    cols = [("× FlashInfer", "speedup_vs_flashinfer")] if any(p.startswith("flashinfer") for p in peers) else []
    return cols + ([("× FlashMLA", "speedup_vs_flashmla")] if "flashmla" in peers else [])


def table(rows: list[dict], title: str, peers=()):
    from rich.table import Table

    from .peers import LABELS

    t = Table(title=title)
    peer_cols = [(f"{LABELS[p]} µs", f"us_{p}") for p in peers]
    ratio_cols = _ratio_columns(peers)
    for col in ("mode", "H", "T", "L", "B", "P", "sets", "kgen µs", "prefix µs", "tree µs", "Triton µs",
                *(c for c, _ in peer_cols), "KV TB/s", "TFLOP/s", "floor µs", "bound", "% floor", "% GEMM floor",
                "× Triton", *(c for c, _ in ratio_cols), "notes"):
        t.add_column(col, justify="left" if col in ("mode", "bound", "notes") else "right")
    for r in rows:
        t.add_row(r["mode"], str(r["H"]), str(r["T"]), str(r["L"]), str(r["B"]), str(r["page_size"]), str(r["sets"]),
                  _fmt(r["us"]), _fmt(r["us_prefix"]), _fmt(r["us_tree"]), _fmt(r["us_triton"]),
                  *(_fmt(r.get(k)) for _, k in peer_cols), _fmt(r["kv_tbps"], ".2f"), _fmt(r["tflops"]),
                  _fmt(r["floor_us"]), r["bound"], _fmt(r["pct_floor"]), _fmt(r.get("pct_floor_gemm")),
                  _fmt(r["speedup_vs_triton"], ".2f"), *(_fmt(r.get(k), ".2f") for _, k in ratio_cols),
                  "; ".join(r["notes"]))
    return t


def _progress(r: dict, peers=()) -> str:
    from .peers import LABELS

    peer_part = "".join(f"  {LABELS[p]} {_fmt(r.get(f'us_{p}'))}" for p in peers)
    ratio_part = "".join(f"  {c} {_fmt(r.get(k), '.2f')}" for c, k in _ratio_columns(peers))
    return (f"{r['mode']:6} H={r['H']:<3} T={r['T']:<4} L={r['L']:<7} B={r['B']:<3} P={r['page_size']:<3} "
            f"kgen {_fmt(r['us']):>9} µs  prefix {_fmt(r['us_prefix']):>9}  tree {_fmt(r['us_tree']):>8}  "
            f"triton {_fmt(r['us_triton']):>10}{peer_part}  floor {_fmt(r['floor_us']):>8}  "
            f"{_fmt(r['pct_floor']):>5}% of floor ({_fmt(r.get('pct_floor_gemm'))}% of GEMM floor)  "
            f"x{_fmt(r['speedup_vs_triton'])} vs triton{ratio_part}  {'; '.join(r['notes'])}")


# ---- the run ------------------------------------------------------------------------------------


def run(spec_path, *, quick: bool = False, page_size: int | None = None, heads=HEADS, trees=TREES,
        contexts=CONTEXTS, batches=BATCHES, decode: bool = True, graph: bool = True, triton: bool = True,
        sets: int | None = None, time_limit: float | None = None, out_dir: Path = RESULTS,
        plan_arch: str | None = None, peers: str = "auto", shapes=None, halves: bool = True,
        tiles: str | None = None, one_shot: bool = False) -> int:
    """Run the benchmark; returns the process exit code (1 if the cross-check fails). plan_arch:
    run that arch's plan (e.g. sm_120 on an H200) instead of the GPU's own; tiles: that plan with
    this tiling (kgen/designs/ text, e.g. seesaw:32,4,1) for every shape. peers: see
    bench/peers.py parse_peers ("auto": the plan arch's peers). shapes: (B, L, T, H) tuples to run
    instead of the grid."""
    from rich.console import Console

    import kgen
    from kgen import designs
    from kgen.errors import KgenError

    from . import ceilings as ceil_mod
    from . import peers as peer_mod
    from .baseline import BaselineError, load_extend_attention

    console = Console(width=None if sys.stdout.isatty() else 240)
    started = time.perf_counter()
    try:
        base = kgen.load_spec(spec_path)
    except KgenError as e:
        raise BenchError(str(e)) from None
    tiling = designs.parse(tiles) if tiles else None
    if tiles and tiling is None:
        raise BenchError(f"--tiles {tiles!r} is not a tiling ({designs.text_forms()})")
    if base.tree.is_static:
        raise BenchError(f"{spec_path}: the benchmark varies the tree size; give a dynamic-tree spec (max_nodes)")
    try:
        peer_mod.parse_peers(peers, plan_arch or "")  # a bad name is an error before the GPU is looked for
    except ValueError as e:
        raise BenchError(str(e)) from None
    if not torch.cuda.is_available():
        raise BenchError("kgen bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    page = page_size or base.cache.page_size
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    shapes = grid(base, quick=quick, page_size=page, heads=heads, trees=trees, contexts=contexts,
                  batches=batches, decode=decode, shapes=shapes)
    major, minor = torch.cuda.get_device_capability(device)
    arch = plan_arch or f"sm_{major}{minor}"
    wanted = peer_mod.parse_peers(peers, arch)

    console.print(f"[bold]kgen bench[/bold] {base.name} on {props.name} ({props.multi_processor_count} SMs), "
                  f"{len(shapes)} shapes, page size {page}, {'CUDA-graph replay' if graph else 'eager'} timing")
    ceilings = ceil_mod.measure(device)
    console.print(f"ceilings: copy {ceilings.copy_tbps:.3f} TB/s (read + write, {ceilings.copy_bytes / 2**30:.1f} GiB "
                  f"buffer), mma.sync bf16 {ceilings.mma_tflops:.1f} TFLOP/s ({ceilings.mma_arch}, "
                  f"{ceilings.mma_grid} CTAs), dense GEMM bf16 {ceilings.gemm_tflops:.1f} TFLOP/s (cuBLAS, "
                  f"n = {ceilings.gemm_n})")

    fwd, triton_from, triton_note = None, None, None
    if triton and base.cache.kv_dtype != "bfloat16":
        triton_note = f"not run: the baseline is timed on bf16 KV; compare {base.name} with its bf16 spec's run"
        console.print(f"[yellow]Triton baseline[/yellow] {triton_note}", highlight=False)
    elif triton:
        try:
            fwd, triton_from = load_extend_attention()
            console.print(f"Triton baseline: extend_attention_fwd from {triton_from}")
        except (BaselineError, ImportError) as e:
            triton_note = _first_line(e)
            console.print(f"[yellow]Triton baseline unavailable[/yellow]: {triton_note}", highlight=False)

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # <spec>-<time>[-p64][-quick]: names sort by time, as kgen/model.py's results_file expects
    plan_tag = f"-{plan_arch.replace('_', '')}plan" if plan_arch else ""
    plan_tag += f"-{tiles.replace(':', '_').replace(',', '_')}" if tiles else ""
    stem = (f"{base.name}-{stamp}{'' if page == base.cache.page_size else f'-p{page}'}{plan_tag}"
            f"{'-quick' if quick else ''}")
    json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
    result = dict(spec=base.name, spec_path=str(spec_path), device=props.name, sm_count=props.multi_processor_count,
                  timestamp=stamp, torch=torch.__version__, python=platform.python_version(), kgen=kgen.__version__,
                  timing="cuda-graph replay over rotated input sets" if graph else "eager over rotated input sets",
                  tree_keys="as the cache stores them", triton_baseline=triton_from, triton_note=triton_note,
                  ceilings=ceilings.as_dict(),
                  plan_arch=plan_arch, flashinfer_peer=peer_mod.flashinfer_for(arch), peers={}, cross_check=[],
                  peer_check=[], rows=[], skipped=[])
    active = []
    for name in wanted:
        reason = peer_mod.unavailable(name, base, page, major)
        result["peers"][name] = dict(label=peer_mod.LABELS[name], version=None if reason else peer_mod.version(name),
                                     skipped=reason)
        if reason:
            console.print(f"[yellow]{peer_mod.LABELS[name]} skipped[/yellow]: {reason}", highlight=False)
        else:
            active.append(name)
    workspace = peer_mod.workspace_for(device) if active else None

    def save():
        json_path.write_text(json.dumps(result, indent=1))

    modules: dict[str, object] = {}

    def module(spec):
        if spec.name not in modules:
            t0 = time.perf_counter()
            mod = modules[spec.name] = kgen.jit(spec, arch=plan_arch, tiles=tiling)
            result.setdefault("plans", {})[spec.name] = {"arch": mod.plan.arch.name, "design": mod.plan.tiles.design,
                                                         "tiles": designs.text(mod.plan.tiles),
                                                         "tuned": str(mod.table.path) if mod.table else None}
            console.print(f"jit {spec.name}: {time.perf_counter() - t0:.1f} s, plan for {mod.plan.arch.name} "
                          f"({mod.plan.tiles.design}{', tuned table' if mod.table else ''})", highlight=False)
        return modules[spec.name]

    ok = True
    for h in sorted({s.H for s in shapes}):
        spec = spec_for(base, h, max(CHECK_SHAPE[0]), page)
        check = cross_check(module(spec), fwd, spec, page, device)
        result["cross_check"].append(check)
        ok &= check["ok"]
        verdict = "[green]OK[/green]" if check["ok"] else "[red]FAIL[/red]"
        triton_part = (f"kgen vs Triton: o rel L2 {check['kgen_vs_triton']:.2e} (<= 1e-2), lse err "
                       f"{check['kgen_lse_vs_triton']:.1e}; Triton vs ref {check['triton_vs_ref']:.2e}; "
                       if "kgen_vs_triton" in check else "")
        console.print(f"cross-check {verdict} H={h} T={check['T']} L={check['L']} P={page}: {triton_part}kgen vs "
                      f"float64 ref {check['kgen_vs_ref']:.2e} (lse {check['kgen_lse_vs_ref']:.1e}); torch reference "
                      f"took {check['ref_ms']:.0f} ms (not timed on the grid: float64, a loop over requests)")
        if active:
            pcheck = peer_check(module(spec), active, spec, page, device, workspace)
            result["peer_check"].append(pcheck)
            parts = []
            for name, c in pcheck["peers"].items():
                label = peer_mod.LABELS[name]
                if not c["ok"]:
                    why = c.get("error") or (f"o rel L2 {c['vs_ref']:.2e} (verify), {c['vs_ref_decode']:.2e} (decode) "
                                             f"against the reference (> {PEER_TOL:g})")
                    result["peers"][name]["skipped"] = f"failed its check at H={h}: {why}"
                    console.print(f"[red]{label} not timed[/red]: {result['peers'][name]['skipped']}", highlight=False)
                    active.remove(name)
                else:
                    parts.append(f"{label} {c['vs_ref']:.2e} (decode {c['vs_ref_decode']:.2e}; vs kgen "
                                 f"{c['vs_kgen']:.2e})")
            console.print(f"peer check H={h} T={pcheck['T']} L={pcheck['L']} P={page}, chain tree: o rel L2 vs float64 "
                          f"ref: kgen {pcheck['kgen_vs_ref']:.2e}, {', '.join(parts) or 'no peer passed'}",
                          highlight=False)
    save()

    for i, shape in enumerate(shapes):
        if time_limit is not None and time.perf_counter() - started > time_limit:
            console.print(f"[yellow]time limit {time_limit:.0f} s reached: {len(shapes) - i} shapes not run[/yellow]")
            result["truncated"] = f"time limit reached before {shape.label()}"
            break
        spec = spec_for(base, shape.H, shape.T, page)
        try:
            row = measure_shape(shape, spec, module(spec), fwd, ceilings, graph=graph, sets=sets, device=device,
                                base_name=base.name, peers=tuple(active), flashinfer=result["flashinfer_peer"],
                                workspace=workspace, halves=halves, one_shot=one_shot)
        except Exception as e:  # a sticky CUDA error: stop, keep what was measured
            result["truncated"] = f"{shape.label()}: {_first_line(e)}"
            console.print(f"[red]stopping[/red] at {shape.label()}: {_first_line(e)}", highlight=False)
            ok = False
            break
        result["rows" if row["us"] is not None else "skipped"].append(row)
        print(_progress(row, active), flush=True)
        save()

    result["seconds"] = time.perf_counter() - started
    save()
    title = (f"{base.name} on {props.name}: copy {ceilings.copy_tbps:.2f} TB/s, mma.sync {ceilings.mma_tflops:.0f} "
             f"TFLOP/s, GEMM {ceilings.gemm_tflops:.0f} TFLOP/s")
    console.print(table(result["rows"] + result["skipped"], title, active))
    try:
        from .plot import plot

        plot(result, png_path)
        console.print(f"wrote {json_path} and {png_path} ({result['seconds']:.0f} s)")
    except ImportError as e:
        console.print(f"wrote {json_path} ({result['seconds']:.0f} s); no plot: {e}")
    return 0 if ok else 1


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_shapes(text: str) -> tuple[tuple[int, int, int, int], ...]:
    """--shapes: a preset name (issue19) or comma-separated BxLxTxH items, e.g. 1x131072x16x8."""
    if text in PRESETS:
        return PRESETS[text]
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"--shapes: {item!r} is not BxLxTxH (positive integers, e.g. "
                                             f"1x131072x16x8) nor a preset ({', '.join(PRESETS)})")
        shapes.append(tuple(int(p) for p in parts))
    return tuple(shapes)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="specs/glm5_sm120.yaml", help="base spec (model dims; heads, tree size and "
                   "page size vary over the grid)")
    p.add_argument("--quick", action="store_true", help=f"a handful of shapes at the spec's head count: {QUICK}")
    p.add_argument("--page-size", type=int, default=None, help="KV page size (default: the spec's, 1)")
    p.add_argument("--heads", type=_ints, default=HEADS, help="comma-separated head counts (default 8,16)")
    p.add_argument("--trees", type=_ints, default=TREES, help="tree sizes T (default 16,64,256)")
    p.add_argument("--contexts", type=_ints, default=CONTEXTS, help="prefix lengths L (default 4096,32768,131072)")
    p.add_argument("--batches", type=_ints, default=BATCHES, help="batch sizes B (default 1,8,32)")
    p.add_argument("--no-decode", dest="decode", action="store_false", help="skip the decode (T = 1) rows")
    p.add_argument("--no-triton", dest="triton", action="store_false", help="skip SGLang's Triton baseline")
    p.add_argument("--no-graph", dest="graph", action="store_false", help="time eagerly instead of CUDA-graph replay")
    p.add_argument("--sets", type=int, default=None, help="rotated input sets per shape (default: enough for "
                   f"{L2_ROTATIONS}x the L2 size, 2..{MAX_SETS})")
    p.add_argument("--time-limit", type=float, default=None, help="start no new shape after this many seconds")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    p.add_argument("--tiles", default=None, help="the plan with this tiling for every shape (e.g. seesaw:32,4,1)")
    p.add_argument("--plan-arch", default=None, help="run this arch's plan (e.g. sm_120 on an H200) instead of the GPU's own")
    p.add_argument("--peers", default="auto", help="peers timed on the same inputs: auto (sm_90 plan: flashinfer_fa3, "
                   "flashmla; other plans: flashinfer_fa2), none, all, or a comma-separated list of flashinfer_fa3, "
                   "flashinfer_fa2, flashmla")
    p.add_argument("--shapes", type=parse_shapes, default=None, help="run these shapes (after --quick's, if given) "
                   "instead of the grid: a preset "
                   f"({', '.join(PRESETS)}) or comma-separated BxLxTxH, e.g. 1x131072x16x8,32x4096x16x8")
    p.add_argument("--no-halves", dest="halves", action="store_false", help="time verify_attention alone, not its "
                   "halves prefix_attention and tree_attention too")
    p.add_argument("--one-shot", action="store_true", help="time kgen's one-shot ops, not prepared steps' calls "
                   "(whose schedule tables spare each call finding its work items)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return run(a.spec, quick=a.quick, page_size=a.page_size, heads=a.heads, trees=a.trees, contexts=a.contexts,
                   batches=a.batches, decode=a.decode, graph=a.graph, triton=a.triton, sets=a.sets,
                   time_limit=a.time_limit, out_dir=a.out, plan_arch=a.plan_arch, peers=a.peers, shapes=a.shapes,
                   halves=a.halves, tiles=a.tiles, one_shot=a.one_shot)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
