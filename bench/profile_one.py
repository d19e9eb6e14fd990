"""One eager verify_attention call at a given shape, for profilers (ncu, compute-sanitizer).

    ncu --clock-control none -k regex:prefix_attn python -m bench.profile_one --shape 1,16,131072
"""

import argparse

import torch

import kgen
from kgen.testing import make_verify_inputs

ap = argparse.ArgumentParser()
ap.add_argument("--spec", default="specs/glm5_sm120.yaml")
ap.add_argument("--shape", default="1,16,131072", help="B,T,L")
args = ap.parse_args()
spec = kgen.load_spec(args.spec)
b, t, l = (int(x) for x in args.shape.split(","))
mod = kgen.jit(spec)
ins = make_verify_inputs(spec, [t] * b, [l] * b, device="cuda")
mod.verify_attention(*ins.verify_args())
torch.cuda.synchronize()
print("done", args.shape)
