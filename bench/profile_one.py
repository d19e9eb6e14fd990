"""One eager verify_attention (or decode) call at a given shape, for profilers.

    ncu --clock-control none -k regex:prefix_attn python -m bench.profile_one --shape 1,16,131072
    python -m bench.profile_one --shape 1,1,4096 --kernels    # per-kernel GPU times (torch.profiler)
"""

import argparse

import torch

import kgen
from kgen.inputs import make_verify_inputs

ap = argparse.ArgumentParser()
ap.add_argument("--spec", default="specs/glm5_sm120.yaml")
ap.add_argument("--shape", default="1,16,131072", help="B,T,L")
ap.add_argument("--kernels", action="store_true", help="print per-kernel GPU times of 10 calls")
args = ap.parse_args()
spec = kgen.load_spec(args.spec)
b, t, l = (int(x) for x in args.shape.split(","))
mod = kgen.jit(spec)
ins = make_verify_inputs(spec, [t] * b, [l] * b, device="cuda")
op = ((lambda: mod.prefix_attention(*ins.prefix_args(), **ins.kv_kwargs)) if t == 1
      else (lambda: mod.verify_attention(*ins.verify_args(), **ins.kv_kwargs)))
op()
torch.cuda.synchronize()
if args.kernels:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            op()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
print("done", args.shape)
