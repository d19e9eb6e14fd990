"""Render + NVRTC compile of every shipped spec (CPU only: NVRTC from pip needs no GPU)."""

import dataclasses
from dataclasses import replace
import random
from pathlib import Path

import pytest
import yaml

import kgen
from kgen import designs, nvrtc, sass, splitkv
from kgen.build import build
from kgen.cache import KernelCache
from kgen.errors import CompileError, PlanError
from kgen.nvrtc import compile_cubin, parse_report
from kgen.arch import ArchError, get_arch, nvrtc_arch
from kgen.designs import MmaSyncTiles, OverlapTiles, SeesawTiles, WgmmaTiles
from kgen.designs import mma_sync as mma_sync_design
from kgen.designs import seesaw as seesaw_design
from kgen.designs import wgmma as wgmma_design
from kgen.model import Shape, work_items
from kgen.plan import plan
from kgen.render import generated_files, render
from kgen.spec import parse_spec

from schedule_rule import MAX_LEVELS, SPLIT_WAVES, cdiv, rule_split, rule_waves, schedule_items

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "specs").glob("*.yaml"))
SM120_SMEM = 99 * 1024


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(tmp_path_factory.mktemp("kgen-cache"))


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_kernel_of_the_sm120_plan_compiles_without_spills(path, arch, cache):
    """The product's plan: within sm_120's 99 KB, 0 spills, also compiled for the H200 that tests it."""
    p = plan(kgen.load_spec(path))
    assert p.arch.name == "sm_120" and p.tiles.design == "mma_sync"
    built = build(p, [arch], cache)
    sparse = {"sparse_attn", "sparse_schedule", "sparse_combine"} if p.spec.model.sparse else set()
    assert {b.variant.kernel for b in built} == {"prefix_attn", "verify_attn", "tree_attn", "lse_combine", "lse_merge",
                                                 "split_schedule",
                                                 "kv_defrag", *sparse}
    for b in built:
        assert b.cubin[:4] == b"\x7fELF", b.variant.name
        assert b.report.spill_bytes <= emulated_e4m3_spill_limit(p.spec, arch), (b.variant.name, b.report)
        if arch == "sm_120":
            assert b.smem_bytes <= SM120_SMEM, (b.variant.name, b.smem_bytes)


def test_the_dsa_rows_block_scales_enter_v_on_sm90_and_p_on_sm120(cache):
    """f16 mode over the DSA pool's rows: the mma.sync loop multiplies V's fragments by their keys'
    scales (one P; bench/NOTES.md v45) where the arch's compiler fits it in 168 registers (sm_90),
    and keeps one scaled P per warp group on sm_120, whose ptxas spills the V path; e4m3 mode always
    scales P (its V bytes go to the MMA as they are)."""
    dsa = kgen.load_spec(ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml")
    e4m3 = dsa.model_copy(update={"cache": dsa.cache.model_copy(update={"mma": "e4m3"})})
    on = {a: mma_sync_design.DESIGN.choose(dsa, get_arch(a)) for a in ("sm_90", "sm_120")}
    assert (on["sm_90"].scales_in_v, on["sm_120"].scales_in_v) == (1, 0)
    assert designs.parse(mma_sync_design.DESIGN.text(on["sm_120"])) == on["sm_120"]  # "mma_sync:32,32,2,3,1,1,0"
    assert all(not t.v_scaled(e4m3) for t in (MmaSyncTiles(32, 32, 2, 3), on["sm_90"]))
    one_p, four_p = on["sm_90"].layout(dsa), replace(on["sm_90"], scales_in_v=0).layout(dsa)
    assert one_p["SCALES_IN_V"] == 1 and four_p["SCALES_IN_V"] == 0
    assert four_p["SMEM_BYTES"] - one_p["SMEM_BYTES"] == 3 * 32 * (one_p["P_STRIDE"] + 8)  # 3 more P, alpha, 1/l
    p = plan(dsa, "sm_90", on["sm_90"])
    built = build(p.__class__(p.spec, p.arch, p.tiles, tuple(p.variant(n) for n in ("verify_attn", "tree_attn")),
                              p.budget), ["sm_90"], cache, inspect=True)
    for b in built:
        ops = set(sass.opcodes(sass.dump(b.cubin)))
        assert {"HMUL2", "REDUX.MAX"} <= ops and b.report.spill_bytes == 0, (b.variant.name, b.report)


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_sm120_plan_in_clusters_compiles_without_spills(path, arch, cache):
    """The tiling an H200 runs the sm_120 plan in for batches of several row tiles a request
    (MmaSync.for_batch: clusters of CLUSTER_ROWS CTAs, multicast copies) compiles within the same
    limits; on sm_90 its attention kernels are built for sm_90a, where ptxas says multicast is fast."""
    p0 = plan(kgen.load_spec(path))
    [tiles] = mma_sync_design.DESIGN.batch_fits(p0.tiles, get_arch("sm_90"))
    assert tiles.cluster == mma_sync_design.CLUSTER_ROWS and not mma_sync_design.DESIGN.batch_fits(p0.tiles,
                                                                                                   get_arch("sm_120"))
    p = plan(p0.spec, "sm_120", tiles)
    attention = [v for v in p.variants if v.kernel in ("prefix_attn", "verify_attn", "tree_attn")]
    assert all(f"__cluster_dims__({tiles.cluster}, 1, 1)" in render(v) for v in attention)
    assert {nvrtc_arch(arch, v.requires) for v in attention} == {"sm_90a" if arch == "sm_90" else arch}
    for b in build(p, [arch], cache):
        assert b.report.spill_bytes <= emulated_e4m3_spill_limit(p.spec, arch), (b.variant.name, b.report)
        assert arch == "sm_90" or b.smem_bytes <= SM120_SMEM, (b.variant.name, b.smem_bytes)


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
@pytest.mark.parametrize("path", [p for p in SHIPPED if kgen.load_spec(p).cache.page_size % 32 == 0],
                         ids=lambda p: p.stem)
def test_the_sm120_plan_copies_whole_tiles_where_pages_hold_them(path, arch, cache):
    """At page size 64 (SGLang's DSA pool) a tile's 32 rows are consecutive slots: the prefix kernels
    stage them with one tensor copy (UTMALDG) beside the row copies (UBLKCP) that partial tiles,
    KGEN_VALIDATE calls and the tree keep; without local memory traffic."""
    p = plan(kgen.load_spec(path))
    for b in build(p, [arch], cache, inspect=True):
        if b.variant.kernel in ("prefix_attn", "verify_attn"):
            assert b.variant.constants["TILE_MAP_ROWS"] == p.tiles.bn, b.variant.name
            assert b.sass["UTMALDG"] >= 1 and b.sass["UBLKCP"] >= 1, (b.variant.name, b.sass)
            assert b.sass["LDL"] == b.sass["STL"] == 0, (b.variant.name, b.sass)
        else:
            assert b.sass.get("UTMALDG", 0) == 0, b.variant.name


@pytest.mark.parametrize("path", [p for p in SHIPPED if kgen.load_spec(p).cache.page_size % 32 == 0
                                  and kgen.load_spec(p).cache.kv_dtype == "bfloat16"], ids=lambda p: p.stem)
def test_the_sm90_plan_copies_whole_bf16_tiles_as_swizzled_column_blocks(path, cache):
    """The seesaw ring over bf16 rows at page size 64: a full tile is 9 tensor copies (one per 128-byte
    column block, in the ring's swizzle) issued by one producer thread, partial tiles cp.async."""
    p = plan(kgen.load_spec(path), "sm_90")
    for b in build(p, ["sm_90"], cache, inspect=True):
        if b.variant.kernel in ("prefix_attn", "verify_attn"):
            assert (b.variant.constants["TILE_MAP_BOX"], b.variant.constants["TILE_MAP_SWIZZLE"]) == (128, 1)
            assert b.sass["UTMALDG"] >= 1 and b.sass["LDGSTS"] >= 1, (b.variant.name, b.sass)


def emulated_e4m3_spill_limit(spec, arch: str) -> int:
    """sm_90 has no e4m3 mma.sync: ptxas unpacks both operands of every emulated e4m3 MMA, and at
    the 168-register cap of the producer-warp loop a few words of fp8 verify spill there. The
    product target (sm_120, native QMMA) gets none."""
    return 32 if arch == "sm_90" and spec.cache.mma_type == "e4m3" else 0


# The wgmma loop's tree range (the verify tail, and tree_attn alone) holds the mask functor beside
# 240 registers of Q, O, scores and P: ptxas spills a few words there, outside the prefix loop.
SM90_TREE_SPILL_BYTES = 256
# Over fp8 rows its producer gets 40 registers (the conversion is latency-bound: bench/NOTES.md v22)
# and its consumers 232: ptxas spills a few more words of theirs, in every attention kernel.
SM90_FP8_SPILL_BYTES = 320
# The seesaw loop (bf16 rows) at its 168-register cap: two words stored at the kernel's start and
# reloaded in its epilogue, outside the loop (bench/NOTES.md v28), and the prefix kernel's one
# word a tile at its producer's 24 registers (v23): 8 B stored, 12 B loaded.
SEESAW_SPILL_BYTES = 20
ATTENTION_KERNELS = ("prefix_attn", "verify_attn", "tree_attn")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_sm90_plan_is_its_own_and_compiles_for_sm90a(path, cache):
    spec = kgen.load_spec(path)
    p = plan(spec, "sm_90")
    wgmma = spec.cache.mma_type != "e4m3"  # e4m3 MMAs keep the mma.sync loop (4 stages)
    assert p.tiles.design == ("seesaw" if wgmma else "mma_sync")  # warpgroup MMAs: the seesaw loop
    built = {b.variant.name: b for b in build(p, ["sm_90"], cache, inspect=True)}
    fp8 = spec.cache.kv_dtype != "bfloat16"
    for name, b in built.items():
        assert b.cubin[:4] == b"\x7fELF" and b.smem_bytes <= 227 * 1024, name
        assert not b.report.wgmma_serialized, (name, b.report.wgmma_serialized)  # else no MMA overlaps another
        if wgmma and fp8 and name in ATTENTION_KERNELS:
            limit = SM90_FP8_SPILL_BYTES
        elif wgmma and name in ("verify_attn", "tree_attn"):
            limit = SM90_TREE_SPILL_BYTES
        elif p.tiles.design == "seesaw" and name in ATTENTION_KERNELS:
            limit = SEESAW_SPILL_BYTES
        else:
            limit = emulated_e4m3_spill_limit(spec, "sm_90")
        assert b.report.spill_bytes <= limit, (name, b.report)
    if wgmma:
        prefix = built["prefix_attn"]
        assert prefix.sass["HGMMA"] > 0 and prefix.sass["LDGSTS"] > 0
        bounded = fp8 or p.tiles.design == "seesaw"

        def about_spills(problem: str) -> bool:  # fp8 rows' and the seesaw producer's spills are bounded above
            return bounded and ("bytes of register spills" in problem or problem.startswith("local memory traffic"))
        assert [p for p in prefix.problems() if not about_spills(p)] == []
        with pytest.raises(ArchError, match="sm_120 lacks wgmma"):
            build(p, ["sm_120"], cache)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_generated_sources_match_golden(path):
    """generated/<name>/ is exactly what rendering the shipped spec gives (run `kgen build` to update)."""
    p = plan(kgen.load_spec(path))
    out = ROOT / "generated" / p.spec.name
    files = generated_files(p)
    on_disk = {f.relative_to(out).as_posix() for f in out.rglob("*") if f.is_file()}
    assert on_disk == set(files), "generated/ is stale: run kgen build " + str(path.relative_to(ROOT))
    for rel, text in files.items():
        assert (out / rel).read_text() == text, f"{rel} differs: run kgen build {path.relative_to(ROOT)}"


def test_plan_respects_sm120_budget_and_refuses_overrun():
    spec = kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml")
    p = plan(spec)
    assert p.tiles.smem_bytes(spec) <= SM120_SMEM
    assert plan(spec, "sm_90").tiles.design == "seesaw"  # the H200 gets its own loop
    too_big = MmaSyncTiles(bm=32, bn=32, warps_m=2, stages=4)
    assert too_big.smem_bytes(spec) > SM120_SMEM
    wide = parse_spec({**spec.model_dump(), "model": {**spec.model.model_dump(), "kv_lora_rank": 1024,
                                                       "qk_rope_head_dim": 256}})
    with pytest.raises(PlanError, match=r"allows 101376 B \(over by \d+ B\)"):
        plan(wide)
    # Two of the plan's CTAs (98,088 B each, 99,200 with the reservation in 128-B units) overrun an
    # SM's 102,400 B: the error names the rounded footprint.
    with pytest.raises(PlanError, match=r"2 attention CTAs per SM need 2 x 99200 B .* 102400 B per SM"):
        plan(spec, tiles=replace(p.tiles, min_blocks=2))


@pytest.mark.parametrize("name, mma, tag", [("glm5_fp8_sm120", "false", "_e4m3f16_"),
                                             ("glm5_fp8_mma_e4m3_sm120", "true", "_e4m3_")])
def test_fp8_plan_halves_the_staged_rows_and_deepens_the_ring(name, mma, tag):
    bf16, fp8 = (kgen.load_spec(ROOT / "specs" / f"{n}.yaml") for n in ("glm5_sm120", name))
    p8 = plan(fp8)
    assert p8.tiles.smem_bytes(fp8) <= SM120_SMEM
    assert p8.tiles.stages == 2 * plan(bf16).tiles.stages == 4  # 592-byte rows instead of 1168
    v = p8.variant("verify_attn")
    src = render(v)
    # BM, BN, warps, groups, stages, fp8 KV, e4m3 MMAs, DSA rows, and the layout: 592-byte KV rows + 16 of padding
    assert f"kgen::AttnConfig<8, 576, 512, 32, 32, 2, 4, 4, true, {mma}, false, 1, Layout>;" in src
    assert "static constexpr int KV_STRIDE = 592;" in src
    assert "const unsigned char* __restrict__ kv_cache" in src and "float kv_scale" in src
    assert tag in v.variant_id


def test_dsa_pool_rows_plan_656_byte_rows_in_three_stages_on_sm120():
    """cache.scales per_block: 656-byte rows (41 16-byte chunks: bulk-copyable, and an odd count, so
    ldmatrix rows need no padding), one P, alpha and 1/l per warp group; 3 stages fit 99 KB."""
    spec = kgen.load_spec(ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml")
    p = plan(spec)
    assert p.tiles.stages == 3 and plan(spec, "sm_90").tiles == SeesawTiles(stages=3)  # the H200's own loop
    kv, s_part, p_bytes, stats, bars = 3 * 32 * 656, 4 * 32 * 40 * 4, 4 * 32 * (32 * 2 + 16), 4 * 2 * 32 * 4, 7 * 8
    assert p.tiles.smem_bytes(spec) == kv + s_part + p_bytes + stats + bars <= SM120_SMEM
    v = p.variant("verify_attn")
    assert "kgen::AttnConfig<8, 576, 512, 32, 32, 2, 4, 3, true, false, true, 1, Layout>;" in render(v)
    assert "static constexpr int KV_STRIDE = 656;" in render(v)
    assert "_e4m3f16_pb_" in v.variant_id and "const unsigned char* __restrict__ kv_cache" in render(v)


@pytest.mark.parametrize("name, mma", [("glm5_fp8_sm120", "HMMA"), ("glm5_fp8_mma_e4m3_sm120", "QMMA")])
def test_fp8_loop_runs_the_mma_its_spec_chooses_on_sm120(name, mma, cache):
    """f16 mode: f16 HMMAs on e4m3 bytes converted in registers (F2FP); e4m3 mode: native QMMAs."""
    from kgen.build import build_variant

    b = build_variant(plan(kgen.load_spec(ROOT / "specs" / f"{name}.yaml")).variant("prefix_attn"), "sm_120", cache,
                      inspect=True)
    assert b.sass.get(mma) == 68 if mma == "HMMA" else b.sass.get(mma) == 36
    assert not b.sass.get("QMMA" if mma == "HMMA" else "HMMA")


@pytest.mark.parametrize("mma, counts", [("f16", {"HMMA": 68}), ("e4m3", {"QMMA": 32, "HMMA": 4})])
def test_dsa_row_loop_runs_latent_in_its_mma_type_and_rope_in_bf16(mma, counts, cache):
    """Per k-step code of one CTA: latent Q·K (32 f16 / 16 e4m3 MMAs), the bf16 rope step (4 HMMAs),
    P·V (32 f16 / 16 e4m3)."""
    from kgen.build import build_variant

    data = yaml.safe_load((ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml").read_text())
    data["cache"]["mma"] = mma
    b = build_variant(plan(parse_spec(data)).variant("prefix_attn"), "sm_120", cache, inspect=True)
    assert {k: b.sass.get(k) for k in counts} == counts and (mma == "e4m3") == bool(b.sass.get("QMMA"))


def test_rendered_source_injects_plan_values():
    p = plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"))
    v = p.variant("prefix_attn")
    src = render(v)
    assert f'extern "C" __global__ void __launch_bounds__({v.threads}, {v.min_blocks}) {v.variant_id}(' in src
    assert "static constexpr int SMEM_BYTES = 98088;" in src and "kgen::prefix_attention<Cfg, 1, false, MASK_WORDS>(" in src
    assert v.variant_id.startswith("prefix_attn__h8_d576_ps1_bf16_t64_sm120__")
    overlap = render(plan(p.spec, tiles=OverlapTiles(16, 4, 1)).variant("prefix_attn"))  # the second sm_120 design
    assert '#include "kgen/attention_overlap.cuh"' in overlap and "static constexpr int SMEM_BYTES = 88872;" in overlap
    assert "kgen::OverlapAttnConfig<8, 576, 512, 16, 4, true, Layout>;" in overlap


def test_variant_ids_are_unique_and_change_with_the_plan():
    spec = kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml")
    ids = [v.variant_id for v in plan(spec).variants]
    assert len(set(ids)) == len(ids)
    other = parse_spec({**spec.model_dump(), "cache": {"page_size": 64, "kv_dtype": "bfloat16"}})
    assert plan(other).variant("prefix_attn").variant_id != plan(spec).variant("prefix_attn").variant_id


def test_compile_error_names_kernel_and_arch_and_keeps_source(tmp_path):
    p = plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"))
    v = p.variant("lse_merge_f32")
    broken = render(v).replace("kgen::merge_two", "kgen::no_such_function")
    with pytest.raises(CompileError, match="compiling lse_merge_f32.cu for sm_120") as e:
        compile_cubin(broken, {}, "sm_120", v.variant_id, "lse_merge_f32.cu")
    assert "error" in str(e.value).lower()


def test_build_keeps_failed_source(tmp_path, monkeypatch):
    import kgen.build as kbuild

    p = plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"))
    v = p.variant("lse_merge_f32")
    monkeypatch.setattr(kbuild, "render", lambda var: "this is not C++;")
    with pytest.raises(CompileError) as e:
        kbuild.build_variant(v, "sm_120", KernelCache(tmp_path))
    kept = tmp_path / "failed" / f"{v.variant_id}.sm_120.cu"
    assert kept.read_text() == "this is not C++;" and str(kept) in str(e.value)
    assert "lse_merge_f32 for sm_120" in str(e.value)


def test_ptxas_report_parsing():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_120'\nptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 136 bytes smem\n")
    r = parse_report(log, "k")
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_bytes, r.static_smem) == (168, 4, 12, 8, 136)
    assert r.spill_bytes == 16


def test_ptxas_report_names_warpgroup_mmas_it_serialized():
    """ptxas's advisory (NVRTC 13's words, from v62's first build: bench/NOTES.md) comes before the
    function's report and names it; only that function's report carries it."""
    advisory = ("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized "
                "due to non wgmma instructions defining accumulator registers of a wgmma between start and end of "
                "the pipeline stage in the function 'k' in line 7005\n")
    entry = ("ptxas info    : Compiling entry function '{0}' for 'sm_90a'\nptxas info    : Function properties for {0}\n"
             "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
             "ptxas info    : Used 168 registers, used 6 barriers\n")
    log = advisory + entry.format("k") + entry.format("j")
    assert parse_report(log, "k").wgmma_serialized == (
        "non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage")
    assert parse_report(log, "j").wgmma_serialized == ""


def test_ptxas_report_counts_the_spills_of_out_of_line_callees():
    """A __noinline__ function (the sparse kernels' list builders) has its own register allocation
    and its own line in ptxas's report: its spills are the kernel's too."""
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_120'\nptxas info    : Function properties for k\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers\n"
           "ptxas info    : Function properties for _Z5buildv\n"
           "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n")
    r = parse_report(log, "k")
    assert (r.stack_bytes, r.spill_stores, r.spill_loads) == (0, 8, 4)
    src = ('__device__ __noinline__ float build(const float* x, int i) { return x[i] * x[i + 1]; }\n'
           'extern "C" __global__ void k(float* x) { x[threadIdx.x] = build(x, threadIdx.x); }')
    log = compile_cubin(src, {}, "sm_90", "k", "k.cu").log
    assert log.count("Function properties for") == 2  # the entry and its callee: both parsed
    assert parse_report(log, "k").spill_bytes == 0


def test_nvrtc_reports_ptxas_usage_on_every_compile_of_a_source(monkeypatch):
    """NVRTC can serve a cubin from the driver's compute cache, without ptxas's report; torch may
    have started the driver with that cache on before kgen compiles, so kgen passes --no-cache.
    (Without a driver, as on CI, NVRTC has no such cache and the second compile runs anyway.)"""
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "0")
    assert "--no-cache" in nvrtc.options("sm_90")
    src = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }'
    reports = [nvrtc.compile_cubin(src, {}, "sm_90", "twice", "twice.cu").report for _ in range(2)]
    assert reports[0] == reports[1] and reports[0].registers > 0


@pytest.mark.parametrize("path", [ROOT / "specs" / "glm5_sm120.yaml", ROOT / "specs" / "glm5_tp4_sm120.yaml"],
                         ids=lambda p: p.stem)
@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
def test_the_grid_holds_every_work_item_and_items_cover_every_tile_once(path, arch, seed):
    """One attention CTA per possible item (Plan.capacity): a schedule that handed out more would
    leave rows unattended. The items of each row tile split its KV tiles without gap or overlap, and
    a call with the tree gives every row tile an item. Random ragged batches, empty prefixes and
    trees, long contexts; the mma.sync loop in clusters too (grids of whole clusters, a cluster's
    CTAs the row tiles of one split)."""
    spec = kgen.load_spec(path)
    p = plan(spec, arch)
    rng = random.Random(seed)
    heads, bm, bn, nodes = p.spec.model.num_q_heads, p.tiles.bm, p.tiles.bn, p.spec.tree.nodes
    groups = (1, 2, 4) if isinstance(p.tiles, MmaSyncTiles) else (1,)
    for _ in range(40):
        batch = rng.choice([1, 2, 3, 8, 31, 64, 257])
        tokens = [rng.choice([0, 1, rng.randint(1, nodes), nodes]) for _ in range(batch)]
        keys = [rng.choice([0, 1, rng.randint(1, 5000), rng.randint(1, 1 << 20)]) for _ in range(batch)]
        target, group = rng.choice([132, 188]), rng.choice(groups)
        cap = plan(spec, arch, dataclasses.replace(p.tiles, cluster=group)).capacity(sum(tokens), batch, target) \
            if group > 1 else p.capacity(sum(tokens), batch, target)
        assert cap.prefix % group == 0 and cap.tree % group == 0
        for min_splits, lens in ((0, keys), (1, keys), (1, [0] * batch)):  # prefix, verify, tree
            items, _ = schedule_items(heads, bm, bn, tokens, lens, target, min_splits, group)
            assert len(items) <= (cap.prefix if any(lens) else cap.tree) and len(items) % group == 0
            for i in range(0, len(items), group):  # a cluster: one split's consecutive row tiles
                cluster = items[i:i + group]
                assert {(b, lo, hi) for b, _, lo, hi in cluster} == {cluster[0][:1] + cluster[0][2:]}
                assert [r for _, r, _, _ in cluster] == list(range(cluster[0][1], cluster[0][1] + group))
            ranges = {}
            for b, r, lo, hi in items:
                ranges.setdefault((b, r), []).append((lo, hi))
            for b in range(batch):
                for r in range(cdiv(tokens[b] * heads, bm)):
                    got = sorted(ranges.get((b, r), []))
                    assert got[0][0] == 0 if got else min_splits == 0
                    assert all(a[1] == c[0] for a, c in zip(got, got[1:]))  # no gap, no overlap
                    assert got[-1][1] == cdiv(lens[b], bn) if got else lens[b] == 0


def test_the_schedules_split_is_the_rules_on_the_device_and_in_the_model(seed):
    """templates/schedule.cuh weighs up to SPLIT_WAVES waves of chunks and halving into up to
    MAX_LEVELS pieces, as kgen/splitkv.py (the model's and the grids' copy) and the rule do, only
    where the rows could fill a wave; the model's split is the rule's on random ragged batches; 144
    row tiles on 132 CTAs are halved into 4 levels (n/2, n/4, n/8, the rest: list scheduling fills
    the last wave) rather than cut into 4 equal splits that run as 5 waves, while 256 row tiles of
    long requests keep one equal split each (two full waves)."""
    header = (ROOT / "templates" / "schedule.cuh").read_text()
    assert f"constexpr int SPLIT_WAVES = {splitkv.SPLIT_WAVES}," in header and splitkv.SPLIT_WAVES == SPLIT_WAVES
    assert f"constexpr int MAX_LEVELS = {splitkv.MAX_LEVELS};" in header and splitkv.MAX_LEVELS == MAX_LEVELS
    rng = random.Random(seed)
    halved = 0
    for _ in range(600):
        batch = rng.choice([1, 2, 5, 16, 64])
        rows = [rng.choice([1, 2, rng.randint(1, 40)]) for _ in range(batch)]
        kv = [rng.choice([0, 1, rng.randint(1, 300), rng.randint(1, 1 << 15)]) for _ in range(batch)]
        target, min_splits, waves = rng.choice([132, 188, 376]), rng.choice([0, 1]), rng.choice([1, SPLIT_WAVES])
        if rng.random() < 0.5:  # rows just past a wave, long prefixes: where halving may pay
            batch, waves, target = rng.choice([14, 16, 20, 24]), SPLIT_WAVES, 132
            rows = [rng.randint(7, 12) for _ in range(batch)]
            kv = [rng.choice([rng.randint(32, 1100), rng.randint(1, 1 << 15)]) for _ in range(batch)]
        got = splitkv.choose_split(rows, kv, target, min_splits, waves)
        assert (got.chunk, got.levels) == rule_split(rows, kv, target, min_splits, waves)
        halved += got.levels > 0
    assert halved > 0  # the random batches reach halving too
    cases = (([16], 8, 1), ([33] * 16, 16, SPLIT_WAVES), ([1] * 32, 8, 1), ([16] * 32, 8, 1), ([16] * 64, 8, SPLIT_WAVES))
    for tokens, heads, waves in cases:
        assert splitkv.waves_of(splitkv.row_tile_bound(heads, 64, sum(tokens), len(tokens)), 132) == waves
        assert rule_waves(heads, 64, tokens, 132) == waves
    # H=16 T=33 L=32768 B=16, BN 32 (the tree's 2 tiles aside): 1305 tile-times in equal splits
    assert splitkv.choose_split([9] * 16, [1024] * 16, 132, 1, SPLIT_WAVES).levels == 4
    assert splitkv.halving_pieces(1024, 4) == [(0, 512), (512, 768), (768, 896), (896, 1024)]
    assert splitkv.choose_split([8] * 32, [1024] * 32, 132, 1, SPLIT_WAVES) == splitkv.SplitRule(1024, 0)


@pytest.mark.parametrize("T, L, B", [(1, 4096, 1), (1, 131072, 32), (16, 32768, 8), (64, 4096, 32), (16, 0, 1),
                                     (256, 131072, 1)])
def test_the_models_schedule_is_the_rule(T, L, B):
    """kgen.model.work_items (B identical requests) hands out the rule's items: the same count, each
    with its KV tiles, the tree's tiles on the last split of a verify call, at least one tile."""
    p = plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"))
    shape, target = Shape(p.spec.model.num_q_heads, T, L, B), 188
    modeled, splits = work_items(p, shape, target)
    items, meta = schedule_items(shape.H, p.tiles.bm, p.tiles.bn, [T] * B, [L] * B, target, 0 if T == 1 else 1)
    last = {}
    for b, r, _, e in items:
        last[b, r] = max(e, last.get((b, r), e))
    expect = [max(1, e - s + (cdiv(T, p.tiles.bn) if T > 1 and e == last[b, r] else 0)) for b, r, s, e in items]
    assert [it.tiles for it in modeled] == expect and splits == meta[0][1]


def test_a_kernel_compiles_with_and_is_keyed_by_only_the_headers_it_includes(monkeypatch):
    from kgen import render as rendering

    src = render(plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml")).variant("lse_merge_bf16"))
    every = rendering.headers()
    assert set(rendering.included_headers(src)) == {"kgen/common.cuh", "kgen/merge.cuh"}  # merge.cuh includes common
    monkeypatch.setattr(rendering, "headers", lambda: {**every, "kgen/attention.cuh": "// edited"})
    assert rendering.included_headers(src) == {k: every[k] for k in ("kgen/common.cuh", "kgen/merge.cuh")}
    monkeypatch.setattr(rendering, "headers", lambda: {**every, "kgen/common.cuh": "// edited"})
    assert rendering.included_headers(src)["kgen/common.cuh"] == "// edited"


# The wgmma loop over fp8 rows (its producer converts each raw tile into the bf16 ring, exactly): the
# sm_90 plan's loop for f16-mode fp8 caches, per-tensor rows and the DSA pool's 656-B rows, in 3
# stages (bench/NOTES.md v20, v20b).


def built_fp8_wgmma_prefix(spec_name: str, tmp_path):
    """The wgmma loop's tiling of a shipped fp8 spec (3 stages; 4 do not fit 227 KB; a tuned choice
    beside the seesaw plan): its layout, its prefix kernel's source, and that kernel built (its
    consumers at 232 registers spill a few words, bounded: SM90_FP8_SPILL_BYTES)."""
    spec = kgen.load_spec(ROOT / "specs" / f"{spec_name}.yaml")
    arch = get_arch("sm_90")
    p = plan(spec, "sm_90", wgmma_design.DESIGN.choose(spec, arch))
    assert p.tiles == WgmmaTiles(stages=3) and plan(spec, "sm_90").tiles == SeesawTiles(stages=3)
    assert wgmma_design.DESIGN.candidates(spec, arch) == [WgmmaTiles(stages=2), WgmmaTiles(stages=3)]
    with pytest.raises(PlanError, match="shared memory"):
        plan(spec, "sm_90", WgmmaTiles(stages=4))
    prefix = p.variant("prefix_attn")
    [b] = build(p.__class__(p.spec, p.arch, p.tiles, (prefix,), p.budget), ["sm_90"], KernelCache(tmp_path),
                inspect=True)
    assert b.sass["HGMMA"] > 0 and b.sass["LDGSTS"] > 0 and b.smem_bytes <= arch.smem_per_block
    assert b.report.spill_bytes <= SM90_FP8_SPILL_BYTES, b.report
    return p.tiles.layout(spec), render(prefix), b


def test_the_wgmma_loop_takes_per_tensor_fp8_rows_in_three_stages(tmp_path):
    layout, source, _ = built_fp8_wgmma_prefix("glm5_fp8_sm120", tmp_path)
    raw_stage = 32 * 576  # 32 rows of 576 e4m3 bytes, a multiple of 128
    assert layout["RAW_STAGE_BYTES"] == raw_stage and layout["RAW_OFF"] % 128 == 0
    assert layout["SMEM_BYTES"] == layout["RAW_OFF"] + 2 * raw_stage + 1024
    assert "32, 3, true, false, Layout>" in source


def test_the_wgmma_loop_takes_the_dsa_pools_rows_with_q_in_shared_memory(tmp_path):
    """656-B rows: the block scales beside each ring stage, all of Q in shared memory (the consumers'
    registers hold a second score accumulator and a second P instead), raw stages of the latent only
    and one score-exchange buffer, so 3 stages fit; per-block P·V is two m64n128 wgmmas."""
    layout, source, b = built_fp8_wgmma_prefix("glm5_dsa_fp8_sm120", tmp_path)
    assert layout["Q_REG_STEPS"] == 0 and layout["Q_SLABS"] == 9  # Q's 576 dims, 64 rows
    assert layout["BAR_OFF"] - layout["X_OFF"] == 64 * 32 * 4  # one tile's scores
    assert layout["RAW_STAGE_BYTES"] == 32 * 512  # the latent of 32 rows
    assert layout["SCALE_OFF"] == layout["RAW_OFF"] + 2 * layout["RAW_STAGE_BYTES"]
    assert layout["SMEM_BYTES"] == layout["SCALE_OFF"] + 3 * 32 * 4 * 4 + 1024
    assert "32, 3, true, true, Layout>" in source
    ops = set(sass.opcodes(sass.dump(b.cubin)))
    assert "HGMMA.64x128x16.F32.BF16" in ops and "HGMMA.64x256x16.F32.BF16" not in ops


def test_the_wgmma_loop_leaves_e4m3_mmas_to_mma_sync():
    arch = get_arch("sm_90")
    e4m3 = kgen.load_spec(ROOT / "specs" / "glm5_fp8_mma_e4m3_sm120.yaml")
    assert wgmma_design.DESIGN.candidates(e4m3, arch) == []  # e4m3 MMAs are the mma.sync loop's
    assert plan(e4m3, "sm_90").tiles.design == "mma_sync"
    with pytest.raises(PlanError, match=r"bf16 or fp8 \(cache.mma f16\)"):
        plan(e4m3, "sm_90", WgmmaTiles(stages=3))


# The seesaw loop (sm_90's second wgmma loop, bf16 rows): each consumer scores alternate tiles over
# all dims, so Q's first 512 dims sit in shared memory (its rope in registers) beside 4 ring stages of
# 32 rows, the two consumers' probability tiles and the per-row values they pass, within 227 KB.


def test_the_seesaw_loop_fits_four_stages_and_compiles_for_sm90a(tmp_path):
    spec, arch = kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"), get_arch("sm_90")
    p = plan(spec, "sm_90", SeesawTiles())
    layout = p.tiles.layout(spec)
    assert layout["STAGE_BYTES"] == 9 * 32 * 128 and layout["Q_SMEM_OFF"] == 4 * layout["STAGE_BYTES"]
    # Q's first 28 k-steps in 7 column blocks (its last 8 are in the consumers' registers)
    assert layout["Q_SLABS"] == 7 and layout["P_OFF"] == layout["Q_SMEM_OFF"] + 7 * 64 * 128
    assert layout["BAR_OFF"] == layout["ROW_OFF"] + 6 * 64 * 4 and layout["P_OFF"] % 1024 == 0
    assert p.tiles.smem_bytes(spec) <= arch.smem_per_block
    assert seesaw_design.DESIGN.candidates(spec, arch) == [SeesawTiles(stages=3), SeesawTiles(stages=4)]
    built = {b.variant.name: b for b in build(p, ["sm_90"], KernelCache(tmp_path), inspect=True)}
    for name in ("prefix_attn", "verify_attn", "tree_attn"):
        b = built[name]
        ops = set(sass.opcodes(sass.dump(b.cubin)))
        # Q·K over all 576 dims in one m64n32 chain; P·V from registers and from the other's tile
        assert {"HGMMA.64x32x16.F32.BF16", "HGMMA.64x256x16.F32.BF16"} <= ops and b.sass["LDGSTS"] > 0, name
        # prefix_attn's producer reloads one word a tile at 24 registers (a 4-byte store and load)
        assert b.report.spill_bytes <= SEESAW_SPILL_BYTES, (name, b.report)


def test_the_seesaw_loop_takes_per_tensor_fp8_rows_in_three_stages_beside_the_raw_stages(tmp_path):
    spec, arch = kgen.load_spec(ROOT / "specs" / "glm5_fp8_sm120.yaml"), get_arch("sm_90")
    assert seesaw_design.DESIGN.choose(spec, arch) == SeesawTiles(stages=3)
    assert seesaw_design.DESIGN.candidates(spec, arch) == [SeesawTiles(stages=3)]  # 4 do not fit 227 KB
    p = plan(spec, "sm_90", SeesawTiles(stages=3))
    layout = p.tiles.layout(spec)
    assert layout["RAW_STAGE_BYTES"] == 32 * 576 and layout["RAW_OFF"] % 128 == 0
    assert layout["SMEM_BYTES"] == layout["RAW_OFF"] + 2 * 32 * 576 + 1024 <= arch.smem_per_block
    verify = p.variant("verify_attn")
    assert "32, 3, true, false, Layout>" in render(verify)
    [b] = build(p.__class__(p.spec, p.arch, p.tiles, (verify,), p.budget), ["sm_90"], KernelCache(tmp_path),
                inspect=True)
    assert b.sass["HGMMA"] > 0 and b.report.spill_bytes == 0, b.report


def test_the_seesaw_loop_takes_the_dsa_pools_rows_with_their_scales_beside_three_stages(tmp_path):
    """656-B rows: raw stages of the latent, each stage's block scales, Q's rope in registers; the
    owner of a tile folds each block's partial scores in fp32 and P·V is two m64n128 wgmmas a k-step
    (from registers and from the other consumer's tile); its consumers spill a few words at 232
    registers (bounded as the wgmma loop's: SM90_FP8_SPILL_BYTES)."""
    spec, arch = kgen.load_spec(ROOT / "specs" / "glm5_dsa_fp8_sm120.yaml"), get_arch("sm_90")
    assert seesaw_design.DESIGN.candidates(spec, arch) == [SeesawTiles(stages=3)]
    p = plan(spec, "sm_90", SeesawTiles(stages=3))
    layout = p.tiles.layout(spec)
    assert layout["RAW_STAGE_BYTES"] == 32 * 512 and layout["SCALE_OFF"] == layout["RAW_OFF"] + 2 * 32 * 512
    assert layout["SMEM_BYTES"] == layout["SCALE_OFF"] + 3 * 32 * 4 * 4 + 1024 <= arch.smem_per_block
    verify = p.variant("verify_attn")
    assert "32, 3, true, true, Layout>" in render(verify)
    [b] = build(p.__class__(p.spec, p.arch, p.tiles, (verify,), p.budget), ["sm_90"], KernelCache(tmp_path),
                inspect=True)
    ops = set(sass.opcodes(sass.dump(b.cubin)))
    assert {"HGMMA.64x32x16.F32.BF16", "HGMMA.64x128x16.F32.BF16"} <= ops and "HGMMA.64x256x16.F32.BF16" not in ops
    assert b.report.spill_bytes <= SM90_FP8_SPILL_BYTES, b.report


def test_the_seesaw_loop_leaves_e4m3_mmas_and_wgmma_less_archs():
    e4m3 = kgen.load_spec(ROOT / "specs" / "glm5_fp8_mma_e4m3_sm120.yaml")
    assert seesaw_design.DESIGN.candidates(e4m3, get_arch("sm_90")) == []
    with pytest.raises(PlanError, match="cache.mma f16"):
        plan(e4m3, "sm_90", SeesawTiles(stages=3))
    with pytest.raises(PlanError, match="wgmma"):
        plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"), "sm_120", SeesawTiles())
