"""(GPU) The measurements the resource model (kgen/model.py) is checked against: plan variants x
shapes timed on the GPU present, its fp8 conversion rate, and optionally ncu's pipe counters.

    python -m bench.model_validate --out $OUT/model_validate.json [--ncu] [--variants a,b] [--shapes x,y]
    python -m bench.model_table $OUT/model_validate.json      # (CPU) the model against them

Variants (VARIANTS) are plans of the shipped specs: the sm_120 plan compiled for this GPU, the
planner's plan for it, tile variants and the two fp8 precisions. Shapes (SHAPES) are compute-bound
(long prefixes, verify), memory-bound (decode) and small ones. Every variant is first checked
against the float64 reference on a small batch; times are CUDA-graph replays of prepared steps'
calls over rotated input sets (bench/timing.py), as bench.run times them. --ncu profiles one call
of NCU_PAIRS each under ncu (a child process per pair: `ncu --clock-control none --metrics
NCU_METRICS`) and stores the counters with the row.
The JSON is rewritten after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (spec file, the arch whose plan runs (None: the GPU's own), mma.sync tiles BM,BN,WARPS_M,STAGES,MIN_BLOCKS)
VARIANTS = {
    "sm120_plan": ("specs/glm5_sm120.yaml", "sm_120", None),  # the row-block loop
    "sm90_plan": ("specs/glm5_sm120.yaml", None, None),  # the wgmma loop on an H100/H200 (and its tuned table)
    "wgmma4": ("specs/glm5_sm120.yaml", "sm_90", "wgmma:32,4,1"),  # the wgmma loop alone, 4 and 3 stages
    "wgmma3": ("specs/glm5_sm120.yaml", "sm_90", "wgmma:32,3,1"),
    "seesaw4": ("specs/glm5_sm120.yaml", "sm_90", "seesaw:32,4,1"),  # sm_90's seesaw loop, 4 and 3 stages
    "seesaw3": ("specs/glm5_sm120.yaml", "sm_90", "seesaw:32,3,1"),
    "wgmma4_tp4": ("specs/glm5_tp4_sm120.yaml", "sm_90", "wgmma:32,4,1"),
    "seesaw4_tp4": ("specs/glm5_tp4_sm120.yaml", "sm_90", "seesaw:32,4,1"),
    "sm90_mma4": ("specs/glm5_sm120.yaml", "sm_90", "mma_sync:32,32,2,4,1"),
    "mma16": ("specs/glm5_sm120.yaml", "sm_90", "mma_sync:16,32,1,4,1"),  # decode's 16-row tiles (v67)
    "bn16": ("specs/glm5_sm120.yaml", "sm_120", "mma_sync:32,16,2,4,1"),
    "stages3": ("specs/glm5_sm120.yaml", "sm_90", "mma_sync:32,32,2,3,1"),
    "overlap": ("specs/glm5_sm120.yaml", "sm_120", "overlap:16,4,1,1"),  # the overlap loop, Q·K a tile ahead
    "overlap16": ("specs/glm5_sm120.yaml", "sm_120", "overlap:16,4,0,1"),  # Q·K not ahead
    "overlap16_s3": ("specs/glm5_sm120.yaml", "sm_120", "overlap:16,3,1,1"),
    "overlap32": ("specs/glm5_sm120.yaml", "sm_120", "overlap:32,2,0,1"),
    "overlap32_s3": ("specs/glm5_sm120.yaml", "sm_90", "overlap:32,3,1,1"),  # sm_90's shared memory only
    "sm120_plan_tp4": ("specs/glm5_tp4_sm120.yaml", "sm_120", None),
    "overlap_tp4": ("specs/glm5_tp4_sm120.yaml", "sm_120", "overlap:16,4,1,1"),
    "overlap32_tp4": ("specs/glm5_tp4_sm120.yaml", "sm_120", "overlap:32,2,0,1"),
    "fp8_f16": ("specs/glm5_fp8_sm120.yaml", "sm_120", None),
    "fp8_e4m3": ("specs/glm5_fp8_mma_e4m3_sm120.yaml", "sm_120", None),
}
# name -> (H, T, L, B); T = 1 is decode (prefix_attention), else verify_attention
SHAPES = {
    "compute": (8, 16, 131072, 1),
    "compute_b8": (8, 16, 32768, 8),
    "compute_t64": (8, 64, 32768, 1),
    "compute_b8_t64": (8, 64, 32768, 8),
    "compute_l32k": (8, 16, 32768, 1),
    "small_b32": (8, 16, 4096, 32),
    "h16_compute": (16, 16, 131072, 1),  # H = 16: the tp4 variants
    "h16_b16_t33": (16, 33, 32768, 16),
    "memory": (8, 1, 131072, 1),
    "memory_b32": (8, 1, 32768, 32),
    "memory_b32_long": (8, 1, 131072, 32),
    "small": (8, 16, 4096, 1),
    "small_decode": (8, 1, 4096, 1),
    # short calls, where a work item's startup shows: more than one of them, so that the startup term
    # is still pinned when the model is refitted without one (docs/performance_model.md, leave one out)
    "short_decode_8k": (8, 1, 8192, 1),
    "short_decode_16k": (8, 1, 16384, 1),
    "short_decode_b4": (8, 1, 4096, 4),
    "small_8k": (8, 16, 8192, 1),
}
NCU_PAIRS = [("sm120_plan", "compute"), ("sm120_plan", "memory"), ("overlap", "compute"), ("overlap32", "compute"),
             ("sm90_plan", "compute"), ("fp8_f16", "compute"),
             ("fp8_e4m3", "compute")]
NCU_METRICS = [
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg",
    "gpc__cycles_elapsed.avg.per_second",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "dram__bytes_read.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
]
NCU_MINIMAL = NCU_METRICS[:1] + NCU_METRICS[3:5] + NCU_METRICS[10:11]  # if ncu refuses a name above
L2_BYTES = 60 << 20
MAX_SET_BYTES = 6 << 30  # input sets per shape: several L2 sizes of KV, within this much memory


def module(variant: str):
    import kgen
    from kgen import designs

    path, plan_for, tiles = VARIANTS[variant]
    return kgen.jit(kgen.load_spec(ROOT / path), arch=plan_for, tiles=designs.parse(tiles) if tiles else None)


def inputs(mod, shape: tuple[int, int, int, int], sets: int, gen):
    from kgen.inputs import make_verify_inputs

    _, t, length, b = shape
    return [make_verify_inputs(mod.spec, [t] * b, [length] * b, generator=gen, device="cuda") for _ in range(sets)]


def one_call(mod, x, decode: bool, workspace=None):
    """A layer's call of a prepared step over input set x, as a server runs it (and as bench.run
    times it): the step and its schedule tables made once, here, outside the timed replays; the
    sets of a shape share one workspace, as a server's layers do."""
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, None if decode else x.op_mask,
                       num_tokens=x.q.shape[0], workspace=workspace)
    if decode:
        return partial(step.prefix, x.q, x.kv_cache, **x.kv_kwargs)
    return partial(step.verify, x.q, x.kv_cache, x.stored_k_tree, **x.kv_kwargs)


def check(mod, gen) -> None:
    from kgen.inputs import make_verify_inputs
    from kgen.accuracy import assert_close_attention, tolerances

    x = make_verify_inputs(mod.spec, [7, 16], [300, 77], generator=gen, device="cuda")
    assert_close_attention(*mod.verify_attention(*x.verify_args(), **x.kv_kwargs), *x.verify_ref(),
                           **tolerances(mod.spec), what=f"{mod.spec.name} with tiles {mod.plan.tiles}")


def time_shape(mod, shape, gen) -> tuple[float, int]:
    import torch

    from kgen.timing import time_rotation

    h, t, length, b = shape
    assert h == mod.spec.model.num_q_heads, (h, mod.spec.name)
    from kgen import kvrows

    kv = b * length * kvrows.row_bytes(mod.spec)
    sets = int(max(2, min(16, math.ceil(4 * L2_BYTES / kv), MAX_SET_BYTES // max(kv, 1))))
    xs = inputs(mod, shape, sets, gen)
    workspace = torch.empty(mod.workspace_bytes(xs[0].q.shape[0], b), dtype=torch.uint8, device="cuda")
    us = time_rotation([one_call(mod, x, t == 1, workspace) for x in xs])
    del xs
    torch.cuda.empty_cache()
    return us, sets


def parse_ncu_csv(text: str) -> dict[str, float | str]:
    """Metric name -> value from `ncu --csv` output (the one profiled kernel)."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if not rows:
        return {}
    head, out = rows[0], {}
    name, value = head.index("Metric Name"), head.index("Metric Value")
    for r in rows[1:]:
        try:
            out[r[name]] = float(r[value].replace(",", ""))
        except ValueError:
            out[r[name]] = r[value]
    return out


def ncu(variant: str, shape: str) -> dict:
    """Counters of one call (after a warm-up call) of `variant` at `shape`, from a child process."""
    exe = shutil.which("ncu")
    if not exe:
        return {"error": "ncu not found on PATH"}
    kernel = "prefix_attn" if SHAPES[shape][1] == 1 else "verify_attn"
    for metrics in (NCU_METRICS, NCU_MINIMAL):
        cmd = [exe, "--clock-control", "none", "--csv", "--metrics", ",".join(metrics), "-k", f"regex:{kernel}",
               "--launch-skip", "1", "--launch-count", "1",
               sys.executable, "-m", "bench.model_validate", "--profile", variant, shape]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        found = parse_ncu_csv(run.stdout)
        if run.returncode == 0 and found:
            return {"kernel": kernel, "metrics": found}
        error = (run.stderr or run.stdout).strip().splitlines()[-3:]
    return {"kernel": kernel, "error": " | ".join(error)}


def profile(variant: str, shape: str) -> None:
    """Child of ncu(): a warm-up call, then the profiled one."""
    import torch

    mod = module(variant)
    x = inputs(mod, SHAPES[shape], 1, torch.Generator(device="cuda").manual_seed(1))[0]
    call = one_call(mod, x, SHAPES[shape][1] == 1)
    for _ in range(2):
        call()
    torch.cuda.synchronize()


def step_tiles(choice, spec, shape: tuple[int, int, int, int]):
    """The tiling a prepared step of `shape` (H, T, L, B) runs: its bucket's tuned tiling, else the
    plan fitted to the batch (kgen.choice.PlanChoice, as the step picks it)."""
    from kgen.model import Shape

    h, t, length, b = shape
    return choice.tiles_for(t * b, b, Shape(h, t, length, b, spec.cache.page_size).context_tokens, h)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.model_validate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "model_validate.json")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    ap.add_argument("--ncu", action="store_true", help=f"also profile {NCU_PAIRS} under ncu")
    ap.add_argument("--profile", nargs=2, metavar=("VARIANT", "SHAPE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.profile:
        profile(*a.profile)
        return 0

    import torch

    import kgen
    from kgen import designs

    from .ceilings import copy_bandwidth, cvt_rate, mma_rate

    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    started = time.perf_counter()
    copy_tbps = copy_bandwidth(dev)[0]
    result = {"device": props.name, "sm_count": props.multi_processor_count, "kgen": kgen.__version__,
              "timing": "cuda-graph replay of prepared steps over rotated input sets",
              "ceilings": {"copy_tbps": copy_tbps, "mma_tflops": mma_rate(dev)[0],
                           "cvt_lanes_per_s_per_sm": cvt_rate(dev)},
              "rows": [], "failed": []}
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        result["seconds"] = round(time.perf_counter() - started, 1)
        a.out.write_text(json.dumps(result, indent=1))

    print(f"{props.name}: {json.dumps(result['ceilings'])}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for variant in a.variants.split(","):
        path, plan_for, tiles = VARIANTS[variant]
        try:
            mod = module(variant)
            check(mod, gen)
        except Exception as e:  # noqa: BLE001 - a variant that cannot build or is wrong is reported, not timed
            result["failed"].append({"variant": variant, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
            print(f"{variant}: FAILED {result['failed'][-1]['error']}", flush=True)
            save()
            continue
        for name in a.shapes.split(","):
            h, t, length, b = SHAPES[name]
            if h != mod.spec.model.num_q_heads:
                continue  # a shape of the other head count's variants
            us, sets = time_shape(mod, SHAPES[name], gen)
            ran = step_tiles(mod.choice, mod.spec, SHAPES[name])
            row = {"variant": variant, "spec_path": path, "plan_for": plan_for, "tiles": designs.text(ran),
                   "shape": name, "H": h, "T": t, "L": length, "B": b, "page_size": mod.spec.cache.page_size,
                   "mode": "decode" if t == 1 else "verify", "us": us, "sets": sets}
            if a.ncu and (variant, name) in NCU_PAIRS:
                row["ncu"] = ncu(variant, name)
            result["rows"].append(row)
            print(f"{variant:11} {name:13} {us:10.1f} us", flush=True)
            save()
        del mod
    save()
    print(f"wrote {a.out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
