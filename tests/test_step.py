"""Prepared steps and launch packing on the CPU (no GPU needed).

The module's kernels are stand-ins that decode each launch's kernelParams the way the driver
does: kernelParams[i] is read as a pointer, and sizeof(C type of parameter i) bytes are read
there. So these tests check, byte for byte, what a GPU would receive: every argument of every
launch, and that a layer call repacks nothing but its own tensors. They also check that bad
per-layer tensors raise before anything is launched.
"""

from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path

import pytest
import torch

import kgen
from kgen import fp8, tilemap
from kgen.arch import Target, get_arch
from kgen.choice import PlanChoice
from kgen.designs import mma_sync as mma_sync_design
from kgen.designs import seesaw as seesaw_design
from kgen.designs import wgmma as wgmma_design
from kgen.designs.base import TileBox
from kgen.designs.mma_sync import MmaSyncTiles
from kgen.designs.seesaw import SeesawTiles
from kgen.designs.wgmma import WgmmaTiles
from kgen.device import ZERO_LENS, DeviceState
from kgen.kernels import COMBINE, PREFIX
from kgen.loading import LoadedPlans
from kgen.ops import Module
from kgen.plan import plan
from kgen.runtime import Kernel
from kgen.signature import Param, ParamLayout
from kgen.splitkv import MIN_SPLIT_TILES, table_bytes, table_items
from kgen.step import workspace_layout
from kgen.inputs import make_verify_inputs

from conftest import spec_named
from schedule_rule import SPLIT_WAVES
from test_attention_gpu import BAD_INPUTS, OP_ARGS

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"
_FORMATS = {"int": "<i", "unsigned": "<I", "long long": "<q", "float": "<f"}


def decode(params: tuple[Param, ...], address: int) -> dict[str, object]:
    """The arguments a launch with kernelParams = `address` passes, as the driver reads them."""
    pointers = (ctypes.c_void_p * len(params)).from_address(address)
    args = {}
    for p, where in zip(params, pointers):
        raw = ctypes.string_at(where, ctypes.sizeof(p.ctypes_type))
        args[p.name] = raw if p.is_blob else struct.unpack("<Q" if p.is_pointer else _FORMATS[p.ctype], raw)[0]
    return args


class RecordingKernel:
    def __init__(self, variant, log: list):
        self.variant, self.log = variant, log
        self.layout = ParamLayout(variant.params)

    def launch(self, grid, params, stream, threads=None):
        self.log.append((self.variant.name, grid, params.address, decode(self.variant.params, params.address),
                         threads or self.variant.threads))


def stub_module(spec_name: str = "glm5_sm120", sm_count: int = 132) -> Module:
    """A Module on the CPU (the sm_120 plan, as on an H200 of `sm_count` SMs) whose kernels record
    their launches in mod.launches; mod.k: its kernels by name, mod.state: its device state."""
    spec = spec_named(spec_name)
    p = plan(spec)
    launches = []
    k = {v.name: RecordingKernel(v, launches) for v in p.variants}
    target = Target(p.arch, get_arch("sm_90"), sm_count)
    state = DeviceState(torch.device("cpu"), stream=lambda: None)
    mod = Module.of(LoadedPlans(spec, target, {p.tiles: p}, {p.tiles: k}), PlanChoice(p.tiles), state)
    mod.launches, mod.k, mod.state = launches, k, state
    return mod


def inputs(mod, sizes=(5, 64, 2), lens=(40, 7, 0), seed=0):
    return make_verify_inputs(mod.spec, list(sizes), list(lens), generator=torch.Generator().manual_seed(seed))


def ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


def expected_grids(p, x, target: int) -> tuple[int, int]:
    """The attention grids of a batch, by the rule kgen/splitkv.py states (not by calling it): a
    wave of `target` CTAs (SPLIT_WAVES where the row tiles exceed a wave) plus one per row tile a
    request can start (ceil(sum T * H / BM) + B) for a call with a prefix; a tree-only call has one
    item per row tile."""
    tokens, batch = x.q.shape[0], x.qo_indptr.numel() - 1
    row_tiles = (tokens * p.spec.model.num_q_heads + p.tiles.bm - 1) // p.tiles.bm + batch
    return (SPLIT_WAVES if row_tiles > target else 1) * target + row_tiles, row_tiles


def expected_launches(mod, x, op: str, out, lse, workspace: int, *, step_has_prefix: bool, layer=None,
                      table: bool = False, schedule: bool = False):
    """The launches of one call, from DESIGN §5 and the kernels' C signatures: `x` holds the
    batch, `layer` (default x) the layer's q, kv_cache and k_tree; `workspace` is its address.
    table: the call's step keeps schedule tables (a prepared step); schedule: the call is its
    kernel's first, which writes the table first."""
    layer = layer or x
    tokens, batch = x.q.shape[0], x.qo_indptr.numel() - 1
    target = mod.target.sm_count * mod.plan.tiles.min_blocks
    prefix_grid, tree_grid = expected_grids(mod.plan, x, target)
    layout = workspace_layout(mod.plan, prefix_grid if step_has_prefix else tree_grid, batch)
    table_size = -(-table_bytes(prefix_grid if step_has_prefix else tree_grid, batch) // 256) * 256
    table_at = workspace + layout.tables + ("verify", "prefix", "tree").index(op) * table_size if table else 0
    scratch = dict(part_o=workspace, part_lse=workspace + layout.part_lse)
    split = dict(qo_indptr=ptr(x.qo_indptr), batch=batch, target_ctas=target, min_split_tiles=MIN_SPLIT_TILES,
                 min_splits=int(op != "prefix"), max_nodes=mod.spec.tree.nodes if op != "prefix" else tokens,
                 total_tokens=tokens,
                 kv_lens=ptr(mod.state.zero_lens(batch)) if op == "tree" else ptr(x.kv_lens))
    attn = dict(q=ptr(layer.q), kv_scale=1.0, **split, validate=0, error_flag=ptr(mod.state.error_flag),
                req_meta=workspace + layout.req_meta, split_table=table_at, **scratch)
    if op != "tree":
        attn.update(kv_cache=ptr(layer.kv_cache), kv_indptr=ptr(x.kv_indptr), kv_indices=ptr(x.kv_indices),
                    num_slots=layer.kv_cache.shape[0])
    if op != "prefix":
        attn.update(k_tree=ptr(layer.k_tree), tree_mask=ptr(x.op_mask))
    combine = dict(qo_indptr=ptr(x.qo_indptr), req_meta=workspace + layout.req_meta, batch=batch, o=ptr(out),
                   lse=ptr(lse), **scratch)
    grid = tree_grid if op == "tree" else prefix_grid
    first = [("split_schedule", grid, dict(**split, error_flag=ptr(mod.state.error_flag), table=table_at))]
    return (first if schedule else []) + [(f"{op}_attn", grid, attn),
                                          ("lse_combine", tokens * mod.spec.model.num_q_heads, combine)]


def launched(mod):
    return [(name, grid, args) for name, grid, _, args, _ in mod.launches]


# ---- parameter blocks --------------------------------------------------------------------------


def test_param_block_holds_each_argument_at_its_pointer_in_its_c_type():
    params = (Param("p", "const float*"), Param("n", "int"), Param("u", "unsigned"), Param("big", "long long"),
              Param("x", "float"), Param("null", "int*"), Param("k", "int"), Param("y", "float"))
    t = torch.zeros(4)
    block = ParamLayout(params).pack(p=t, n=-7, u=2**32 - 1, big=-(2**40), x=0.1, null=None, k=3, y=2)
    assert decode(params, block.address) == dict(p=t.data_ptr(), n=-7, u=2**32 - 1, big=-(2**40),
                                                 x=struct.unpack("<f", struct.pack("<f", 0.1))[0], null=0, k=3, y=2.0)
    address = block.address
    block.values.p, block.values.x = 12345, 2.5  # the per-layer update: in place, same kernelParams
    assert block.address == address and decode(params, address)["p"] == 12345 and decode(params, address)["x"] == 2.5


def test_a_tensor_map_argument_is_its_128_bytes_by_value():
    params = (Param("n", "int"), Param("kv_map", "const __grid_constant__ kgen::TileMap"), Param("p", "int*"))
    layout = ParamLayout(params)
    block = layout.pack(n=5, kv_map=bytes(range(128)), p=None)
    assert decode(params, block.address) == dict(n=5, kv_map=bytes(range(128)), p=0)
    block.values.kv_map = tilemap.TileMapBytes.from_buffer_copy(bytes(range(128, 256)))  # a layer call's update
    assert decode(params, block.address)["kv_map"] == bytes(range(128, 256))
    with pytest.raises(TypeError, match="kv_map: expected 128 bytes"):
        layout.pack(n=5, kv_map=bytes(127), p=None)


def test_every_kernel_of_every_spec_packs_where_ctypes_reads():
    for path in sorted(SPEC_DIR.glob("*.yaml")):
        for v in plan(kgen.load_spec(path)).variants:
            layout = ParamLayout(v.params)  # checks struct's offsets against ctypes' itself
            values = {p.name: bytes([i + 1]) * 128 if p.is_blob else i + 1 for i, p in enumerate(v.params)}
            assert decode(v.params, layout.pack(**values).address) == values, v.name


def test_param_layout_rejects_missing_unexpected_overflowing_and_tensor_scalars():
    layout = ParamLayout((Param("n", "int"), Param("p", "int*")))
    with pytest.raises(TypeError, match=r"missing \['p'\], unexpected \[\]"):
        layout.pack(n=1)
    with pytest.raises(TypeError, match=r"unexpected \['m'\]"):
        layout.pack(n=1, p=None, m=2)
    with pytest.raises(ValueError, match="kernel argument n: 2147483648 does not fit a C int"):
        layout.pack(n=2**31, p=None)
    with pytest.raises(TypeError, match="kernel argument n: expected a Python int or float, got Tensor"):
        layout.pack(n=torch.tensor(3), p=None)  # not its value: a tensor is never a scalar argument


def test_kernel_launch_passes_the_block_address_as_kernel_params():
    calls = []
    kernel = Kernel(plan(spec_named("glm5_sm120")).variant("lse_combine"), "func", stream=lambda: None,
                    launch=lambda *args: calls.append(args) or (0,))
    block = ParamLayout(kernel.variant.params).pack(part_o=1, part_lse=2, qo_indptr=3, req_meta=4, batch=5, o=6, lse=7)
    kernel.launch(40, block, "stream")
    kernel.launch(40, block, "stream", 256)  # fewer threads than the variant's: the combine's groups
    assert calls == [("func", 40, 1, 1, 1024, 1, 1, 0, "stream", block.address, 0),
                     ("func", 40, 1, 1, 256, 1, 1, 0, "stream", block.address, 0)]
    assert isinstance(calls[0][9], int)  # cuda-python reads an int kernelParams as a ready void**


def test_the_sparse_kernels_are_launched_to_overlap_the_kernel_before_them():
    """The sparse kernels (waits_for_prior: the combine since v29, the attention kernels since v98)
    go through cuLaunchKernelEx with programmatic stream serialization, one config per grid, threads
    and stream, reused; every other kernel (the dense combine too: bench/NOTES.md v29) through
    cuLaunchKernel."""
    from cuda.bindings import driver

    assert not any(v.waits_for_prior for v in plan(spec_named("glm5_sm120")).variants)
    p = plan(spec_named("glm5_dsa_sm120"))
    assert [v.name for v in p.variants if v.waits_for_prior] == ["sparse_verify_attn", "sparse_gather_attn",
                                                                 "sparse_combine"]
    plain, ex = [], []
    kernel = Kernel(p.variant("sparse_combine"), "func", stream=lambda: None, launch=lambda *a: plain.append(a) or (0,),
                    launch_ex=lambda *a: ex.append(a) or (0,))
    block = ParamLayout(kernel.variant.params).pack(part_o=1, part_lse=2, qo_indptr=3, req_meta=4, batch=5, o=6, lse=7)
    s1, s2 = driver.CUstream(11), driver.CUstream(12)
    for threads, stream in ((256, s1), (256, driver.CUstream(11)), (1024, s1), (256, s2)):
        kernel.launch(40, block, stream, threads)
    assert plain == [] and [(f, params, extra) for _, f, params, extra in ex] == [("func", block.address, 0)] * 4
    configs = [c for c, *_ in ex]
    assert configs[0] is configs[1] and len({id(c) for c in configs}) == 3  # same stream handle: same config
    for c, threads, stream in zip(configs, (256, 256, 1024, 256), (11, 11, 11, 12)):
        assert (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ) == (40, 1, 1, threads, 1, 1)
        assert (c.sharedMemBytes, int(c.hStream), c.numAttrs) == (0, stream, 1)
        attr = c.attrs[0]
        assert attr.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        assert attr.value.programmaticStreamSerializationAllowed == 1


def _body(text: str, function: str) -> str:
    """The source of a device function, from its name to the next function's template line."""
    start = text.index(f" {function}(")
    return text[start:text.find("\ntemplate <", start)]


def test_a_kernel_launched_to_overlap_waits_before_it_reads_what_the_kernel_before_wrote():
    """A kernel launched to overlap its predecessor must wait for it before reading its output: the
    combine's search reads only the caller's qo_indptr before its wait_for_prior_grid; the sparse
    attention kernel waits before anything (the schedule table, req_meta and its inputs may all be
    the previous kernel's); the variants that waits_for_prior compile those. The sparse attention
    kernel lets the combine launch once its loop is done (launch_dependents); the dense ones, whose
    combine waits for nothing, do not."""
    from kgen.render import headers, included_headers, render

    combine = _body(headers()["kgen/merge.cuh"], "combine_partials")
    before, after = combine.split("wait_for_prior_grid();")
    assert "req_meta" not in before.split("{", 1)[1] and "part_" not in before.split("{", 1)[1]
    assert "req_meta[b]" in after and "part_lse[" in after and "part_o +" in after
    sparse = _body(headers()["kgen/sparse_attention.cuh"], "sparse_attention")
    before_wait = re.sub(r"//.*", "", sparse.split("{", 1)[1].split("wait_for_prior_grid();")[0])
    assert all(s.strip().startswith(("static_assert", "using ")) for s in before_wait.split(";")[:-1])  # compile time only
    waiting = {v.name: v for v in plan(spec_named("glm5_dsa_sm120")).variants if v.waits_for_prior}
    assert sorted(waiting) == ["sparse_combine", "sparse_gather_attn", "sparse_verify_attn"]
    src = render(waiting["sparse_combine"])
    assert "kgen::combine_partials<" in src and "kgen/merge.cuh" in included_headers(src)
    for name in ("sparse_verify_attn", "sparse_gather_attn"):
        assert "kgen/sparse_attention.cuh" in included_headers(render(waiting[name])), name
    assert sparse.rfind("attend<C>(") < sparse.find("launch_dependents();")  # after the loop
    for function in ("prefix_attention", "tree_attention"):
        assert "launch_dependents" not in _body(headers()["kgen/attention_kernels.cuh"], function), function


@pytest.mark.parametrize("rows, items, batch, threads", [
    (128, 135, 1, 1024),   # B=1 T=16 H=8, 135 items of 64 rows: ~68 states a row -> 8 groups (the most)
    (128, 3, 1, 128),      # no split: one state a row, one group
    (4096, 228, 32, 128),  # B=32 T=16 H=8: ~4 states a row
    (256, 168, 32, 256),   # decode B=32 H=8: an item holds 8 real rows of its 64 -> ~5 states a row
    (512, 144, 4, 256),    # B=4 T=16 H=8: ~18 states a row, but 512 rows of 4 groups would not fit a wave
])
def test_the_combine_has_a_group_of_threads_per_4_states_a_row_can_have(rows, items, batch, threads):
    assert COMBINE.threads(512, rows, items, 64, batch, sm_count=132) == threads


# ---- what a call launches ------------------------------------------------------------------------


@pytest.mark.parametrize("spec_name", ["glm5_sm120", "glm5_static5_sm120", "glm5_p16_sm120"])
def test_one_shot_ops_launch_attention_and_combine_with_every_argument(spec_name):
    mod = stub_module(spec_name)
    x = inputs(mod, (5, 5, 5) if mod.spec.tree.is_static else (5, 64, 2))
    for op, call in (("verify", lambda **o: mod.verify_attention(*x.verify_args(), **o)),
                     ("prefix", lambda **o: mod.prefix_attention(*x.prefix_args(), **o)),
                     ("tree", lambda **o: mod.tree_attention(*x.tree_args(), **o))):
        mod.launches.clear()
        out, lse = x.outputs()
        assert call(out=out, lse=lse) == (out, lse)
        workspace = mod.launches[0][3]["part_o"]  # the call's own step allocated it
        assert launched(mod) == expected_launches(mod, x, op, out, lse, workspace, step_has_prefix=op != "tree"), op


def test_a_step_packs_once_and_a_layer_call_rewrites_only_its_own_tensors():
    mod = stub_module()
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    layers = [inputs(mod, seed=s) for s in (1, 2, 3)]  # the same batch: another layer's q, cache and keys
    outputs = [y.outputs() for y in layers]
    for y, (out, lse) in zip(layers, outputs):
        step.verify(y.q, y.kv_cache, y.k_tree, out=out, lse=lse)
    assert len({(name, address) for name, _, address, _, _ in mod.launches}) == 3, "three blocks, packed once"
    rows, items = step.num_tokens * mod.spec.model.num_q_heads, PREFIX.grid(step._capacity)
    assert mod.launches[2][4] == COMBINE.threads(512, rows, items, step.plan.tiles.bm, step.batch, 132), "its groups"
    assert launched(mod) == [launch for i, (y, (out, lse)) in enumerate(zip(layers, outputs)) for launch in
                             expected_launches(mod, x, "verify", out, lse, step.workspace.data_ptr(),
                                               step_has_prefix=True, layer=y, table=True, schedule=i == 0)]


def test_reschedule_writes_the_tables_of_the_kernels_a_step_has_run_and_one_shot_ops_keep_none():
    mod = stub_module()
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    step.reschedule()
    assert mod.launches == []  # no kernel has run: no table to write
    step.verify(x.q, x.kv_cache, x.k_tree)
    step.tree(x.q, x.k_tree)
    first = {args["table"]: args for name, _, args in launched(mod) if name == "split_schedule"}
    mod.launches.clear()
    step.reschedule()
    step.verify(x.q, x.kv_cache, x.k_tree)  # after reschedule: no table write of its own
    names = [name for name, *_ in mod.launches]
    assert names == ["split_schedule", "split_schedule", "verify_attn", "lse_combine"]
    again = {args["table"]: args for name, _, args in launched(mod) if name == "split_schedule"}
    assert again == first and len(first) == 2  # verify's table and tree's, from the same blocks
    mod.launches.clear()
    mod.verify_attention(*x.verify_args())
    assert [name for name, *_ in mod.launches] == ["verify_attn", "lse_combine"]
    assert mod.launches[0][3]["split_table"] == 0


def test_the_schedule_tables_layout_is_the_headers():
    from kgen import render
    from kgen.splitkv import STAMP_WORDS

    header = render.headers()["kgen/schedule.cuh"]
    assert f"constexpr int STAMP_WORDS = {STAMP_WORDS}," in header
    assert "(STAMP_WORDS + 2 * batch + 1 + 3) / 4 * 4" in header  # items_word: table_items / 4
    assert table_bytes(10, 3) == table_items(3) + 16 * 10 + 16 * 3 and table_items(3) == 80


def test_validate_mode_steps_keep_no_table(monkeypatch):
    monkeypatch.setenv("KGEN_VALIDATE", "1")
    mod = stub_module()
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    step.verify(x.q, x.kv_cache, x.k_tree)
    assert [name for name, *_ in mod.launches] == ["verify_attn", "lse_combine"]
    assert mod.launches[0][3]["split_table"] == 0


def test_one_step_runs_verify_prefix_and_tree():
    mod = stub_module()
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    for op, call in (("tree", lambda o, l: step.tree(x.q, x.k_tree, out=o, lse=l)),
                     ("prefix", lambda o, l: step.prefix(x.q, x.kv_cache, out=o, lse=l)),
                     ("verify", lambda o, l: step.verify(x.q, x.kv_cache, x.k_tree, out=o, lse=l))):
        mod.launches.clear()
        out, lse = x.outputs()
        call(out, lse)
        assert launched(mod) == expected_launches(mod, x, op, out, lse, step.workspace.data_ptr(),
                                                  step_has_prefix=True, table=True, schedule=True), op


def test_tree_calls_read_zero_prefix_lengths():
    mod = stub_module()
    x = inputs(mod)
    mod.state.zero_lens(3).fill_(0)
    mod.tree_attention(*x.tree_args())
    kv_lens = mod.launches[0][3]["kv_lens"]
    assert ctypes.string_at(kv_lens, 4 * 3) == bytes(12)


def test_fp8_tree_keys_in_bf16_are_quantized_with_the_layer_scale():
    mod = stub_module("glm5_fp8_sm120")
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    seen = []
    verify = mod.k["verify_attn"]

    def launch(grid, params, stream):  # reads the keys as the kernel would, while they exist
        args = decode(verify.variant.params, params.address)
        seen.append((args, ctypes.string_at(args["k_tree"], x.k_tree.numel())))

    verify.launch = launch
    step.verify(x.q, x.kv_cache, x.k_tree, kv_scale=0.75)
    [(args, keys)] = seen
    assert args["kv_scale"] == 0.75
    assert keys == fp8.quantize(x.k_tree, 0.75).view(torch.uint8).numpy().tobytes()


def test_workspace_is_allocated_per_step_or_shared():
    mod = stub_module()
    x = inputs(mod)
    need = mod.workspace_bytes(x.q.shape[0], 3)
    shared = torch.empty(need, dtype=torch.uint8)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask, workspace=shared)
    step.verify(x.q, x.kv_cache, x.k_tree)
    args = mod.launches[1][3]
    assert args["part_o"] == shared.data_ptr()
    assert shared.data_ptr() < args["part_lse"] < args["req_meta"] < args["split_table"] < shared.data_ptr() + need
    assert all(args[k] % 256 == shared.data_ptr() % 256 for k in ("part_lse", "req_meta", "split_table"))
    assert mod.launches[0][3]["table"] == args["split_table"]
    with pytest.raises(ValueError, match=rf"workspace: this step needs {need} bytes"):
        mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask, workspace=shared[:-16])


def test_validate_mode_is_read_like_the_cache_switches(monkeypatch):
    mod = stub_module()
    x = inputs(mod)
    for value, on in (("", 0), ("0", 0), ("false", 0), ("No", 0), (" FALSE ", 0), ("1", 1), ("yes", 1), ("true", 1)):
        monkeypatch.setenv("KGEN_VALIDATE", value)
        mod.launches.clear()
        mod.verify_attention(*x.verify_args())
        assert mod.launches[0][3]["validate"] == on, repr(value)


def test_validate_mode_raises_what_the_device_reported(monkeypatch):
    monkeypatch.setenv("KGEN_VALIDATE", "1")
    mod = stub_module()
    x = inputs(mod)
    mod.state.error_flag.fill_(7)
    mod.k["verify_attn"].launch = lambda *a: mod.state.error_flag.fill_(2)  # a page outside kv_cache
    with pytest.raises(ValueError, match=r"\bkv_indices\b"):
        mod.verify_attention(*x.verify_args())
    mod.k["verify_attn"].launch = lambda *a: None
    mod.verify_attention(*x.verify_args())  # the flag is cleared before each call


# ---- bad input ---------------------------------------------------------------------------------

CPU_BAD_INPUTS = [b for b in BAD_INPUTS if b[0] != "q is on the CPU"] + [
    ("q is on another device", "q", lambda a: {"q": a["q"].to("meta")}),
    ("kv_cache is on another device", "kv_cache", lambda a: {"kv_cache": a["kv_cache"].to("meta")}),
]


@pytest.mark.parametrize("op,wrong,arg,breaks", [
    (op, wrong, arg, breaks) for op, names in OP_ARGS.items() for wrong, arg, breaks in CPU_BAD_INPUTS
    if arg in names + ("out", "lse")
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_is_named_before_any_launch(op, wrong, arg, breaks):
    mod = stub_module()
    x = inputs(mod)
    kwargs = {name: getattr(x, name) for name in OP_ARGS[op]}
    kwargs.update(breaks(kwargs))
    with pytest.raises((ValueError, TypeError), match=rf"\b{arg}\b"):
        getattr(mod, op)(**kwargs)
    assert mod.launches == []


@pytest.mark.parametrize("wrong,arg,call", [
    ("q with an extra token", "q", lambda s, x: s.verify(torch.cat([x.q, x.q[:1]]), x.kv_cache, x.k_tree)),
    ("q float32", "q", lambda s, x: s.verify(x.q.float(), x.kv_cache, x.k_tree)),
    ("kv_cache 3-D with 2 heads", "kv_cache", lambda s, x: s.prefix(x.q, x.kv_cache.view(-1, 2, 288))),
    ("kv_cache a view at an odd offset", "kv_cache",
     lambda s, x: s.verify(x.q, x.kv_cache.view(-1)[4:-572].view(-1, 576), x.k_tree)),
    ("k_tree missing", "k_tree", lambda s, x: s.verify(x.q, x.kv_cache, None)),
    ("k_tree one row short", "k_tree", lambda s, x: s.tree(x.q, x.k_tree[1:])),
    ("out bf16 of the wrong width", "out", lambda s, x: s.verify(x.q, x.kv_cache, x.k_tree,
                                                                 out=torch.empty(71, 8, 576, dtype=torch.bfloat16))),
    ("lse non-contiguous", "lse", lambda s, x: s.prefix(x.q, x.kv_cache, lse=torch.empty(8, 71).t())),
    ("kv_scale on a bf16 cache", "kv_scale", lambda s, x: s.verify(x.q, x.kv_cache, x.k_tree, kv_scale=2.0)),
    ("kv_scale a tensor", "kv_scale", lambda s, x: s.verify(x.q, x.kv_cache, x.k_tree, kv_scale=torch.tensor(1.0))),
])
def test_bad_per_layer_tensors_are_named_by_a_prepared_step(wrong, arg, call):
    mod = stub_module()
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    with pytest.raises((ValueError, TypeError), match=rf"\b{arg}\b"):
        call(step, x)
    assert mod.launches == []
    step.verify(x.q, x.kv_cache, x.k_tree)  # the step still works after a refused call (its first)
    assert [name for name, *_ in mod.launches] == ["split_schedule", "verify_attn", "lse_combine"]


def test_a_step_says_what_it_was_prepared_without():
    mod = stub_module()
    x = inputs(mod)
    tree_only = mod.prepare(x.qo_indptr, tree_mask=x.tree_mask)
    with pytest.raises(ValueError, match="kv_indptr/kv_indices/kv_lens: this step was prepared without a prefix"):
        tree_only.verify(x.q, x.kv_cache, x.k_tree)
    prefix_only = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, num_tokens=x.q.shape[0])
    with pytest.raises(ValueError, match="tree_mask: this step was prepared without a tree mask"):
        prefix_only.tree(x.q, x.k_tree)
    with pytest.raises(ValueError, match="num_tokens: a step without a tree mask needs num_tokens"):
        mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens)
    with pytest.raises(TypeError, match="num_tokens: expected an int"):
        mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, num_tokens=71.0)
    with pytest.raises(TypeError, match=r"\bkv_indices\b"):
        mod.prepare(x.qo_indptr, x.kv_indptr, None, x.kv_lens, x.tree_mask)
    assert mod.launches == []


def test_static_tree_steps_take_no_mask_and_check_the_token_count():
    mod = stub_module("glm5_static5_sm120")
    x = inputs(mod, (5, 5), (10, 0))
    with pytest.raises(ValueError, match="tree_mask: spec glm5_static5_sm120 has a static tree compiled in"):
        mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens)
    assert step.num_tokens == 10
    q9 = x.q[:9].contiguous()
    with pytest.raises(ValueError, match=r"q: a static tree of 5 nodes needs 2 x 5 tokens, got 9"):
        mod.verify_attention(q9, x.kv_cache, x.k_tree[:9].contiguous(), x.qo_indptr, x.kv_indptr, x.kv_indices,
                             x.kv_lens, None)
    mod.prefix_attention(q9, x.kv_cache, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens)  # no tree: any count


def test_empty_batches_check_their_tensors_and_launch_nothing():
    mod = stub_module()
    x = inputs(mod, (0, 0), (5, 0))
    out, lse = mod.verify_attention(*x.verify_args())
    assert out.shape == (0, 8, 512) and lse.shape == (0, 8) and mod.launches == []
    with pytest.raises(ValueError, match=r"\bk_tree\b"):
        mod.verify_attention(*x.verify_args()[:2], x.k_tree[:, :512], *x.verify_args()[3:])


def test_the_zero_lengths_buffer_grows_for_big_tree_only_batches(monkeypatch):
    mod = stub_module()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    x = inputs(mod, [1] * (ZERO_LENS + 1), [0] * (ZERO_LENS + 1))
    mod.tree_attention(*x.tree_args())
    zeros = mod.state.zero_lens(ZERO_LENS + 1)
    assert zeros.numel() > ZERO_LENS and mod.launches[0][3]["kv_lens"] == zeros.data_ptr()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
        mod.state.zero_lens(10 * ZERO_LENS)


# ---- tensor maps: a layer's cache for kernels that copy whole tiles ---------------------------------

class RecordingMaps:
    """TileMaps' interface without a driver: a map's bytes name its key; `made` counts encodes."""

    def __init__(self):
        self.made = []

    def get(self, *key):
        if key not in self.made:
            self.made.append(key)
        return tilemap.TileMapBytes.from_buffer_copy(repr(key).encode().ljust(tilemap.MAP_BYTES, b"\0"))


def test_a_layer_call_passes_its_cache_as_a_tensor_map_where_pages_hold_whole_tiles():
    """Page size 64 (SGLang's DSA pool): the sm_120 plan's prefix kernels take the layer's cache as a
    tensor map boxing one CTA's slice of staged rows, made once per cache, not per call."""
    mod = stub_module("glm5_p64_sm120")
    mod.state.tile_maps = maps = RecordingMaps()
    x = inputs(mod)
    step = mod.prepare(x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_lens, x.tree_mask)
    layers = [inputs(mod, seed=s) for s in (1, 2)]
    for y in layers + layers:
        step.verify(y.q, y.kv_cache, y.k_tree)
    stride, rows = mod.plan.tiles.layout(mod.spec)["KV_STRIDE"], mod.plan.tiles.bn
    assert (stride, rows) == (1168, 32), "bf16 rows padded to an odd count of 16-byte chunks, a 32-row tile"
    keys = [(y.kv_cache.data_ptr(), y.kv_cache.shape[0], 1152, stride, rows, False) for y in layers]
    assert maps.made == keys, "one map per layer's cache"
    verify = [args for name, _, args in launched(mod) if name == "verify_attn"]
    assert [a["kv_map"] for a in verify] == [bytes(maps.get(*k)) for k in keys + keys]


def test_kernels_that_cannot_copy_whole_tiles_take_no_tensor_map():
    """Page size 1 scatters a tile's rows: row copies only, no kv_map parameter, no map made."""
    mod = stub_module("glm5_sm120")
    mod.state.tile_maps = maps = RecordingMaps()
    x = inputs(mod)
    mod.verify_attention(*x.verify_args())
    assert maps.made == [] and all("kv_map" not in args for _, _, args in launched(mod))


def with_page(spec_name: str, page: int):
    spec = spec_named(spec_name)
    return spec.model_copy(update={"cache": spec.cache.model_copy(update={"page_size": page})})


@pytest.mark.parametrize("page, bn, cluster, rows", [
    (1, 32, 1, 0), (16, 32, 1, 0),  # a tile spans pages
    (64, 32, 1, 32), (64, 32, 2, 16), (32, 16, 2, 8),
    (64, 16, 4, 0),  # a 4-row slice of 1168-byte rows does not start 128-byte aligned
])
def test_the_mma_sync_loop_boxes_a_slice_of_staged_rows_where_pages_hold_whole_tiles(page, bn, cluster, rows):
    tiles = MmaSyncTiles(bm=32, bn=bn, warps_m=2, stages=2, cluster=cluster)
    box = mma_sync_design.DESIGN.tile_box(with_page("glm5_sm120", page), tiles)
    assert box == (TileBox(rows, 1168) if rows else None)


@pytest.mark.parametrize("spec_name, page, box", [
    ("glm5_sm120", 64, TileBox(32, 128, swizzle128=True)), ("glm5_sm120", 1, None), ("glm5_sm120", 16, None),
    ("glm5_fp8_sm120", 64, TileBox(32, 576)), ("glm5_fp8_sm120", 16, None),  # fp8 rows: a raw tile, converted
    ("glm5_dsa_fp8_sm120", 64, TileBox(32, 512)),  # the DSA rows' latent (their scales and rope are copied)
])
def test_the_sm90_rings_box_bf16_column_blocks_or_raw_fp8_tiles_within_pages(spec_name, page, box):
    spec = with_page(spec_name, page)
    for design, tiles in ((seesaw_design.DESIGN, SeesawTiles(stages=3)), (wgmma_design.DESIGN, WgmmaTiles(bn=32, stages=3))):
        assert design.tile_box(spec, tiles) == box


def test_tile_maps_are_checked_before_the_driver_is_asked():
    with pytest.raises(ValueError, match="cannot be tensor-copied"):
        tilemap.encode(0x1008, 100, 1152, 1168, 32)  # an address the copy engine cannot start at
    with pytest.raises(ValueError, match="cannot be tensor-copied"):
        tilemap.encode(0x1000, 100, 1152, 256, 32, swizzle128=True)  # the swizzle spans 128 bytes
    with pytest.raises(ValueError, match="cannot be tensor-copied"):
        tilemap.encode(0x1000, 100, 656, 2064, 32)  # a box is at most 2048 bytes (256 elements)
    with pytest.raises(ValueError, match="outside what a tensor copy addresses"):
        tilemap.encode(0x1000, 2**31, 1152, 1168, 32)
