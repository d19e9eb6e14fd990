"""Render + NVRTC compile of every shipped spec (CPU only: NVRTC from pip needs no GPU)."""

import random
from pathlib import Path

import pytest

import kgen
from kgen import nvrtc
from kgen.build import build
from kgen.cache import KernelCache
from kgen.errors import CompileError, PlanError
from kgen.nvrtc import compile_cubin, parse_report
from kgen.arch import ArchError
from kgen.plan import MIN_SPLIT_TILES, AttentionTiles, attention_smem_bytes, plan, work_capacity
from kgen.render import generated_files, render
from kgen.spec import parse_spec

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
    sparse = {"sparse_attn"} if p.spec.model.sparse else set()
    assert {b.variant.kernel for b in built} == {"prefix_attn", "tree_attn", "lse_merge", "kv_defrag", *sparse}
    for b in built:
        assert b.cubin[:4] == b"\x7fELF", b.variant.name
        assert b.report.spill_bytes <= emulated_e4m3_spill_limit(p.spec, arch), (b.variant.name, b.report)
        if arch == "sm_120":
            assert b.smem_bytes <= SM120_SMEM, (b.variant.name, b.smem_bytes)


def emulated_e4m3_spill_limit(spec, arch: str) -> int:
    """sm_90 has no e4m3 mma.sync: ptxas unpacks both operands of every emulated e4m3 MMA, and at
    the 168-register cap of the producer-warp loop a few words of fp8 verify spill there. The
    product target (sm_120, native QMMA) gets none."""
    return 32 if arch == "sm_90" and spec.cache.mma_type == "e4m3" else 0


# The wgmma loop's tree range (the verify tail, and tree_attn alone) holds the mask functor beside
# 240 registers of Q, O, scores and P: ptxas spills a few words there, outside the prefix loop.
SM90_TREE_SPILL_BYTES = 256


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_sm90_plan_is_its_own_and_compiles_for_sm90a(path, cache):
    spec = kgen.load_spec(path)
    p = plan(spec, "sm_90")
    wgmma = spec.cache.kv_dtype == "bfloat16"  # fp8 caches keep the mma.sync loop (4 stages)
    assert p.tiles.design == ("wgmma" if wgmma else "mma_sync")
    built = {b.variant.name: b for b in build(p, ["sm_90"], cache, inspect=True)}
    for name, b in built.items():
        assert b.cubin[:4] == b"\x7fELF" and b.smem_bytes <= 227 * 1024, name
        limit = (SM90_TREE_SPILL_BYTES if wgmma and name in ("verify_attn", "tree_attn")
                 else emulated_e4m3_spill_limit(spec, "sm_90"))
        assert b.report.spill_bytes <= limit, (name, b.report)
    if wgmma:
        assert built["prefix_attn"].sass["HGMMA"] > 0 and built["prefix_attn"].sass["LDGSTS"] > 0
        assert built["prefix_attn"].problems() == []
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
    assert attention_smem_bytes(spec, p.tiles) <= SM120_SMEM
    assert plan(spec, "sm_90").tiles.design == "wgmma"  # the H200 gets its own loop
    too_big = AttentionTiles(bm=32, bn=32, warps_m=2, stages=4)
    assert attention_smem_bytes(spec, too_big) > SM120_SMEM
    wide = parse_spec({**spec.model_dump(), "model": {**spec.model.model_dump(), "kv_lora_rank": 1024,
                                                       "qk_rope_head_dim": 256}})
    with pytest.raises(PlanError, match=r"allows 101376 B \(over by \d+ B\)"):
        plan(wide)


@pytest.mark.parametrize("name, mma, tag", [("glm5_fp8_sm120", "false", "_e4m3f16_"),
                                             ("glm5_fp8_mma_e4m3_sm120", "true", "_e4m3_")])
def test_fp8_plan_halves_the_staged_rows_and_deepens_the_ring(name, mma, tag):
    bf16, fp8 = (kgen.load_spec(ROOT / "specs" / f"{n}.yaml") for n in ("glm5_sm120", name))
    p8 = plan(fp8)
    assert attention_smem_bytes(fp8, p8.tiles) <= SM120_SMEM
    assert p8.tiles.stages == 2 * plan(bf16).tiles.stages == 4  # 592-byte rows instead of 1168
    v = p8.variant("verify_attn")
    src = render(v)
    # BM, BN, warps, groups, stages, fp8 KV, e4m3 MMAs, S row pad
    assert f"kgen::AttnConfig<8, 576, 512, 32, 32, 2, 4, 4, true, {mma}, 8>;" in src
    assert "const unsigned char* __restrict__ kv_cache" in src and "float kv_scale" in src
    assert tag in v.variant_id


@pytest.mark.parametrize("name, mma", [("glm5_fp8_sm120", "HMMA"), ("glm5_fp8_mma_e4m3_sm120", "QMMA")])
def test_fp8_loop_runs_the_mma_its_spec_chooses_on_sm120(name, mma, cache):
    """f16 mode: f16 HMMAs on e4m3 bytes converted in registers (F2FP); e4m3 mode: native QMMAs."""
    from kgen.build import build_variant

    b = build_variant(plan(kgen.load_spec(ROOT / "specs" / f"{name}.yaml")).variant("prefix_attn"), "sm_120", cache,
                      inspect=True)
    assert b.sass.get(mma) == 68 if mma == "HMMA" else b.sass.get(mma) == 36
    assert not b.sass.get("QMMA" if mma == "HMMA" else "HMMA")


def test_rendered_source_injects_plan_values():
    p = plan(kgen.load_spec(ROOT / "specs" / "glm5_sm120.yaml"))
    v = p.variant("prefix_attn")
    src = render(v)
    assert f'extern "C" __global__ void __launch_bounds__({v.threads}, {v.min_blocks}) {v.variant_id}(' in src
    assert "static_assert(Cfg::SMEM_BYTES == 98088" in src and "kgen::prefix_attention<Cfg, 1, false, MASK_WORDS>(" in src
    assert v.variant_id.startswith("prefix_attn__h8_d576_ps1_bf16_t64_sm120__")


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



def test_nvrtc_reports_ptxas_usage_on_every_compile_of_a_source(monkeypatch):
    """NVRTC can serve a cubin from the driver's compute cache, without ptxas's report; torch may
    have started the driver with that cache on before kgen compiles, so kgen passes --no-cache.
    (Without a driver, as on CI, NVRTC has no such cache and the second compile runs anyway.)"""
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "0")
    assert "--no-cache" in nvrtc.options("sm_90")
    src = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }'
    reports = [nvrtc.compile_cubin(src, {}, "sm_90", "twice", "twice.cu").report for _ in range(2)]
    assert reports[0] == reports[1] and reports[0].registers > 0


def schedule_items(heads: int, bm: int, bn: int, tokens: list[int], keys: list[int], target: int,
                   min_splits: int) -> int:
    """How many work items templates/schedule.cuh hands out (its arithmetic, in Python)."""
    row_tiles = [-(-t * heads // bm) for t in tokens]
    kv_tiles = [-(-k // bn) for k in keys]
    work = sum(m * n for m, n in zip(row_tiles, kv_tiles))
    chunk = max(MIN_SPLIT_TILES, -(-work // target))
    return sum(m * max(min_splits, -(-n // chunk)) for m, n in zip(row_tiles, kv_tiles))


@pytest.mark.parametrize("path", [ROOT / "specs" / "glm5_sm120.yaml", ROOT / "specs" / "glm5_tp4_sm120.yaml"],
                         ids=lambda p: p.stem)
def test_the_grid_holds_every_work_item_of_the_schedule(path, seed):
    """One attention CTA per possible item (work_capacity): a schedule that handed out more would
    leave rows unattended. Random ragged batches, empty prefixes and trees, long contexts."""
    p = plan(kgen.load_spec(path))
    rng = random.Random(seed)
    heads, bm, bn, nodes = p.spec.model.num_q_heads, p.tiles.bm, p.tiles.bn, p.spec.tree.nodes
    for _ in range(2000):
        batch = rng.choice([1, 2, 3, 8, 31, 64, 257])
        tokens = [rng.choice([0, 1, rng.randint(1, nodes), nodes]) for _ in range(batch)]
        keys = [rng.choice([0, 1, rng.randint(1, 5000), rng.randint(1, 1 << 20)]) for _ in range(batch)]
        target = rng.choice([132, 188])
        prefix_grid, tree_grid = work_capacity(p, sum(tokens), batch, target)
        for min_splits in (0, 1):  # prefix_attention, verify_attention
            assert schedule_items(heads, bm, bn, tokens, keys, target, min_splits) <= prefix_grid
        assert schedule_items(heads, bm, bn, tokens, [0] * batch, target, 1) <= tree_grid  # tree_attention
