"""Time verify_attention for candidate attention tilings on the GPU present (plan tuning).

    python -m bench.tune --spec specs/glm5_sm120.yaml --tiles 32,32,2,2,1 16,16,1,2,2

Each tiling is BM,BN,WARPS_M,STAGES,MIN_BLOCKS. Every run checks the output against the float64
reference on a small shape first; timings are CUDA-graph replays over rotating input sets
(bench/timing.py).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

import kgen
from kgen.errors import KgenError
from kgen.plan import AttentionTiles
from kgen.spec import TargetSpec
from kgen.testing import assert_close_attention, make_verify_inputs, tolerances

from .timing import time_rotation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="specs/glm5_sm120.yaml")
    ap.add_argument("--tiles", nargs="+", required=True)
    ap.add_argument("--shapes", nargs="+", default=["1,16,131072", "1,64,32768", "8,16,32768"], help="B,T,L")
    ap.add_argument("--target", help="plan for this arch instead of the spec's target (e.g. sm_90)")
    args = ap.parse_args()
    spec = kgen.load_spec(args.spec)
    if args.target:
        spec = spec.model_copy(update={"target": TargetSpec(arch=args.target)})
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    for text in args.tiles:
        bm, bn, wm, st, mb = (int(x) for x in text.split(","))
        try:
            mod = kgen.jit(spec, tiles=AttentionTiles(bm, bn, wm, st, mb))
        except KgenError as e:
            print(f"{text}: not built: {e}")
            continue
        regs = {b.variant.name: b.report.registers for b in mod.built}
        small = make_verify_inputs(spec, [7, 16], [300, 77], generator=gen, device="cuda")
        assert_close_attention(*mod.verify_attention(*small.verify_args(), **small.kv_kwargs), *small.verify_ref(),
                               **tolerances(spec))
        for shape in args.shapes:
            b, t, l = (int(x) for x in shape.split(","))
            sets = max(2, min(8, int(4e9 // (b * l * 1152 * 2))))
            ins = [make_verify_inputs(spec, [t] * b, [l] * b, generator=gen, device="cuda") for _ in range(sets)]
            us = time_rotation([partial(mod.verify_attention, *x.verify_args(), **x.kv_kwargs) for x in ins])
            flops = 2 * b * t * spec.model.num_q_heads * (l + t) * (spec.model.head_dim + spec.model.value_dim)
            print(f"{spec.target.arch} tiles {text} regs {regs['prefix_attn']}/{regs['tree_attn']} B={b} T={t} L={l}: "
                  f"{us:.1f} us, {flops / us / 1e6:.1f} TFLOP/s", flush=True)
            del ins


if __name__ == "__main__":
    main()
