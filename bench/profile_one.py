"""One eager verify_attention (or decode) call at a given shape, for profilers; with a sparse spec
(model.index_topk) one sparse_verify_attention call over indexer-shaped lists (bench/sparse.py's).

    ncu --clock-control none -k regex:prefix_attn python -m bench.profile_one --shape 1,16,131072
    ncu --clock-control none -k regex:prefix_attn python -m bench.profile_one \\
        --spec specs/glm5_dsa_fp8_sm120.yaml --tiles wgmma:32,3,1    # a tuning candidate's kernel
    python -m bench.profile_one --shape 1,1,4096 --kernels    # per-kernel GPU times (torch.profiler)
    ncu --clock-control none -k regex:flash -c 1 python -m bench.profile_one --spec specs/glm5_p64_sm120.yaml \
        --shape 8,64,32768 --peer flashmla                      # a peer's kernel on the same shape
    ncu --clock-control none --set full --import-source yes -k regex:sparse_verify \\
        python -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072
"""

import argparse

import torch

import kgen
from kgen import designs
from kgen.inputs import make_verify_inputs
from kgen.sparse_testing import make_sparse_inputs

ap = argparse.ArgumentParser()
ap.add_argument("--spec", default="specs/glm5_sm120.yaml")
ap.add_argument("--shape", default="1,16,131072", help="B,T,L")
ap.add_argument("--shared", type=float, default=0.7, help="sparse specs: the share of K every token of a request lists")
ap.add_argument("--gather", action="store_true", help="sparse specs: the per-token-gather kernel instead of the union")
ap.add_argument("--empty-lists", action="store_true", help="sparse specs: lists of -1 only (the scan, the tree and the fixed costs)")
ap.add_argument("--calls", type=int, default=1, help="calls before --kernels' (ncu: --launch-skip picks one)")
ap.add_argument("--kernels", action="store_true", help="print per-kernel GPU times of 10 calls")
ap.add_argument("--plan-arch", default=None, help="another arch's plan (sm_120 on an H200)")
ap.add_argument("--tiles", default=None, help="a tiling instead of the plan's (e.g. wgmma:32,3,1)")
ap.add_argument("--peer", default=None, help="a peer's call on the same shape (chain trees) instead of kgen's "
                "(bench/peers.py: flashmla, flashinfer_fa3, flashinfer_fa2)")
args = ap.parse_args()
spec = kgen.load_spec(args.spec)
b, t, l = (int(x) for x in args.shape.split(","))
tiles = designs.parse(args.tiles) if args.tiles else None
if args.tiles and tiles is None:
    ap.error(f"--tiles {args.tiles!r} is not a tiling ({designs.text_forms()})")
mod = kgen.jit(spec, arch=args.plan_arch, tiles=tiles)
if spec.model.sparse:
    x = make_sparse_inputs(spec, [t] * b, [l] * b, spec.model.index_topk, shared=args.shared, window=256,
                           device="cuda")
    lists = torch.full_like(x.topk_indices, -1) if args.empty_lists else x.topk_indices
    step = mod.prepare_sparse(x.base.qo_indptr, lists, x.base.op_mask, union=not args.gather)
    print(f"union rows per request: {x.union_sizes()}")
    k_tree = x.base.stored_k_tree  # as a server passes them

    def op():
        return step.verify(x.base.q, x.base.kv_cache, k_tree, **x.base.kv_kwargs)
elif args.peer:
    from bench import peers
    from bench.run import pool_pages

    ins = make_verify_inputs(spec, [t] * b, [l] * b, tree_kind="chain", device="cuda",
                             num_pages=pool_pages([l] * b, [t] * b, spec.cache.page_size, True))
    op = peers.prepare(args.peer, ins, peers.chain_kv(ins, with_tree=t > 1))
else:
    ins = make_verify_inputs(spec, [t] * b, [l] * b, device="cuda")
    op = ((lambda: mod.prefix_attention(*ins.prefix_args(), **ins.kv_kwargs)) if t == 1
          else (lambda a=ins.verify_args(stored_tree=True): mod.verify_attention(*a, **ins.kv_kwargs)))
for _ in range(args.calls):
    op()
torch.cuda.synchronize()
if args.kernels:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            op()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
print("done", args.shape)
