"""Host overhead of an attention call (issue 12; DESIGN §5, §9): how long Python keeps the CPU busy
per verify call, next to how long the GPU takes for it.

    python -m bench.host [--spec specs/glm5_sm120.yaml] [--shapes 1,16,4096 8,16,32768] [--out DIR]
    python -m bench.host --spec specs/glm5_dsa_sm120.yaml --shapes 1,16,131072   # sparse_verify_attention

For each shape (B requests x T tree tokens x L prefix tokens, the spec's heads) and each way of
calling it:
- one-shot:  mod.verify_attention(...)            (prepare + run per call)
- prepared:  step.verify(q, kv_cache, k_tree)     (mod.prepare once, as a server does per step)
- torch.ops: torch.ops.kgen.verify_attention(...) (the custom op; allocates its outputs)
the first two with out= given and lse allocated ("out", as the SGLang backend calls them) and
with both allocated ("alloc"). Host µs per call is
time.perf_counter around `--calls` back-to-back calls with no sync inside, the GPU held busy
first (torch.cuda._sleep) so that every call only enqueues; the median of `--rounds` rounds.
GPU µs is the prepared call replayed in a CUDA graph over rotated input sets (kgen/timing.py; their
steps in one workspace);
eager µs is the wall time per call of back-to-back prepared calls up to a final sync.

A sparse spec (model.index_topk) times sparse_verify_attention the same ways, over lists shaped
like an indexer's. Prints a table and writes <out>/host-<spec>-<time>.json. Targets on the H200
(issue 12), for the worst shape: prepared (out=) <= 15 µs, one-shot (out=) <= 40 µs, torch.ops
<= 50 µs; exit code 1 if one is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((1, 16, 4096), (1, 16, 32768), (8, 16, 32768), (32, 64, 4096))  # (B, T, L)
TARGETS_US = {"prepared_out": 15.0, "oneshot_out": 40.0, "torch_op": 50.0}
MODES = ("prepared_out", "prepared_alloc", "oneshot_out", "oneshot_alloc", "torch_op")
BUSY_CYCLES = 50_000_000  # ~25 ms of GPU sleep ahead of each round: every timed call only enqueues
L2_ROTATIONS = 4  # rotated input sets hold this many L2 sizes of KV (GPU time only)


def host_us(call, *, calls: int, rounds: int) -> float:
    """Median over rounds of host µs per call of `calls` back-to-back calls, the GPU running behind."""
    per_round = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(BUSY_CYCLES)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_round)


def eager_us(call, *, calls: int, rounds: int) -> float:
    """Wall µs per call of back-to-back calls up to a final sync (host and GPU overlapped)."""
    per_round = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(per_round)


def measure(mod, shape: tuple[int, int, int], *, calls: int, rounds: int, device) -> dict:
    from kgen.timing import time_rotation

    b, t, length = shape
    modes, rotated = (sparse_calls if mod.spec.model.sparse else dense_calls)(mod, shape, device)
    row = dict(B=b, T=t, L=length, H=mod.spec.model.num_q_heads)
    for name, call in modes.items():
        call()  # first calls pack parameter blocks and warm the allocator
        row[name] = host_us(call, calls=calls, rounds=rounds)
    row["eager_us"] = eager_us(modes["prepared_out"], calls=calls, rounds=rounds)
    row["gpu_us"] = time_rotation(rotated)
    row["sets"] = len(rotated)
    return row


def set_count(kv_bytes: int, device) -> int:
    """Rotated input sets for the GPU time: together L2_ROTATIONS times the L2 (at most 15)."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (60 << 20)
    return max(1, min(15, math.ceil(L2_ROTATIONS * l2 / max(1, kv_bytes))))


def call_modes(mod, step, v, op: str, args: tuple) -> dict:
    """The MODES' calls of one layer over verify inputs v: the prepared `step`, the module's
    one-shot `op` and its torch custom op (both on one-shot arguments `args`). The tree keys are
    passed as the cache stores them, as SGLang's backends pass them (bf16 keys would cost an fp8
    op a quantize per call: ~10 torch launches, ~150 us of host time for the DSA pool's rows)."""
    layer, kw = (v.q, v.kv_cache, v.stored_k_tree), v.kv_kwargs
    out, _ = v.outputs()
    one_shot, torch_op = getattr(mod, op), getattr(torch.ops.kgen, op)
    return {
        "prepared_out": lambda: step.verify(*layer, **kw, out=out),
        "prepared_alloc": lambda: step.verify(*layer, **kw),
        "oneshot_out": lambda: one_shot(*args, **kw, out=out),
        "oneshot_alloc": lambda: one_shot(*args, **kw),
        "torch_op": lambda: torch_op(*args, mod.spec.name, v.kv_scale),
    }


def rotated_calls(steps, sets) -> list:
    """A prepared call per rotated input set (VerifyInputs), outputs given, for the GPU time."""
    outs = [v.outputs() for v in sets]
    return [lambda v=v, st=st, o=o, k=v.stored_k_tree: st.verify(v.q, v.kv_cache, k, **v.kv_kwargs, out=o[0],
                                                                   lse=o[1])
            for v, st, o in zip(sets, steps, outs)]


def dense_calls(mod, shape, device):
    """The modes' calls of one input set, and prepared calls over rotated sets (their steps in one
    workspace, as a server's layers share their batch's step)."""
    from kgen.inputs import make_verify_inputs

    b, t, length = shape
    x = make_verify_inputs(mod.spec, [t] * b, [length] * b, device=device)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.op_mask)
    modes = call_modes(mod, step, x, "verify_attention", x.verify_args(stored_tree=True))
    kv_bytes = b * length * mod.spec.model.head_dim * x.kv_cache.element_size()
    sets = [x] + [make_verify_inputs(mod.spec, [t] * b, [length] * b, device=device)
                  for _ in range(set_count(kv_bytes, device) - 1)]
    workspace = torch.empty(mod.workspace_bytes(x.q.shape[0], b), dtype=torch.uint8, device=device)
    steps = [mod.prepare(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens, s.op_mask, workspace=workspace)
             for s in sets]
    return modes, rotated_calls(steps, sets)


def sparse_calls(mod, shape, device):
    """dense_calls' modes and rotated calls for a sparse spec: sparse_verify_attention over lists
    shaped like an indexer's (bench/sparse.py's: 70% of K shared by a request's tokens)."""
    from kgen import kvrows
    from kgen.sparse_testing import make_sparse_inputs

    b, t, length = shape
    width = mod.spec.model.index_topk

    def inputs():
        return make_sparse_inputs(mod.spec, [t] * b, [length] * b, width, shared=0.7, window=256, device=device)

    x = inputs()
    step = mod.prepare_sparse(x.base.qo_indptr, x.topk_indices, x.base.op_mask)
    modes = call_modes(mod, step, x.base, "sparse_verify_attention", x.args(stored_tree=True))
    listed_bytes = b * t * width * kvrows.row_bytes(mod.spec)  # at most: the union reads fewer rows
    sets = [x] + [inputs() for _ in range(set_count(listed_bytes, device) - 1)]
    workspace = torch.empty(mod.sparse_workspace_bytes(x.base.q.shape[0], b), dtype=torch.uint8, device=device)
    steps = [mod.prepare_sparse(s.base.qo_indptr, s.topk_indices, s.base.op_mask, workspace=workspace) for s in sets]
    return modes, rotated_calls(steps, [s.base for s in sets])


def table(rows: list[dict], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("B", "T", "L", "H", *(f"{m} µs" for m in MODES), "eager µs", "GPU µs"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(*(str(r[k]) for k in ("B", "T", "L", "H")), *(f"{r[m]:.1f}" for m in MODES),
                  f"{r['eager_us']:.1f}", f"{r['gpu_us']:.1f}")
    return t


def verdicts(rows: list[dict]) -> dict[str, bool]:
    """Whether the worst shape meets each host target."""
    return {mode: max(r[mode] for r in rows) <= limit for mode, limit in TARGETS_US.items()}


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        b, t, length = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B,T,L (three integers), got {text!r}") from None
    return b, t, length


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="specs/glm5_sm120.yaml")
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=list(SHAPES), help="B,T,L ...")
    p.add_argument("--calls", type=int, default=50, help="back-to-back calls per timed round (default 50)")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds per mode; the median is reported")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON (default bench/results)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench.host needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from rich.console import Console

    import kgen

    spec = kgen.load_spec(a.spec)
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    mod = kgen.jit(spec)
    rows = []
    for shape in a.shapes:
        rows.append(measure(mod, shape, calls=a.calls, rounds=a.rounds, device=device))
        print(rows[-1], flush=True)
    ok = verdicts(rows)
    result = dict(spec=spec.name, device=props.name, torch=torch.__version__, python=platform.python_version(),
                  kgen=kgen.__version__, calls=a.calls, rounds=a.rounds, targets_us=TARGETS_US, meets_targets=ok,
                  rows=rows)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"host-{spec.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table(rows, f"host µs per verify call, {spec.name} on {props.name}"))
    console.print("targets (worst shape): " + ", ".join(f"{m} <= {TARGETS_US[m]:.0f} µs: {'yes' if v else 'NO'}"
                                                         for m, v in ok.items()))
    console.print(f"wrote {path}")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
