"""sm_120 fidelity without sm_120 hardware (CPU, runs in CI): every shipped spec's sm_120 attention
kernels are compiled with NVRTC and disassembled with the pip nvdisasm, and must use tensor-core
MMAs and bulk copies, never touch local memory or spill, and reach the occupancy their plan targets.
A build with a forced register cap shows the same checks catch a spilling kernel.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kgen import nvrtc, sass
from kgen.build import BuiltKernel, build_variant
from kgen.cache import KernelCache
from kgen.cli import app
from kgen.plan import plan
from kgen.render import headers, render
from kgen.spec import load_spec

SPECS = sorted((Path(__file__).resolve().parents[1] / "specs").glob("*.yaml"))
ATTENTION_KERNELS = ("prefix_attn", "verify_attn", "tree_attn")
# ptxas lets __launch_bounds__ override --maxrregcount unless told otherwise.
REGISTER_CAP_32 = ("--maxrregcount=32", "--ptxas-options=--override-directive-values")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> KernelCache:
    """A private, empty cache: every kernel here is really compiled and disassembled."""
    return KernelCache(tmp_path_factory.mktemp("kgen-cache"))


@pytest.fixture(scope="module")
def built_sm120(cache):
    done: dict[tuple[str, str], BuiltKernel] = {}

    def get(spec_path: Path, kernel: str) -> BuiltKernel:
        if (spec_path.name, kernel) not in done:
            variant = plan(load_spec(spec_path)).variant(kernel)
            done[spec_path.name, kernel] = build_variant(variant, "sm_120", cache, inspect=True)
        return done[spec_path.name, kernel]

    return get


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
@pytest.mark.parametrize("spec_path", SPECS, ids=[p.stem for p in SPECS])
def test_sm120_attention_kernel_matches_its_plan(built_sm120, spec_path, kernel):
    b = built_sm120(spec_path, kernel)
    assert b.arch == "sm_120"
    c = b.sass
    assert c["HMMA"] > 0 or sass.mma_count(c) > 0, f"no tensor-core MMA in {sass.summary(c)}"
    assert c["UBLKCP"] > 0, f"no bulk copy in {sass.summary(c)}"
    assert c["LDSM"] > 0, f"no ldmatrix in {sass.summary(c)}"
    assert c["LDL"] == 0 and c["STL"] == 0, f"local memory traffic: {sass.summary(c)}"
    assert b.report.spill_bytes == 0
    occ = b.occupancy
    assert occ.ctas_per_sm >= b.variant.min_blocks, f"{occ} < min_blocks {b.variant.min_blocks}"
    assert occ.warps_per_sm == occ.ctas_per_sm * b.variant.threads // 32
    assert b.problems() == []


def test_sass_counts_are_cached_in_the_entry_and_match_a_fresh_disassembly(built_sm120, cache):
    first = built_sm120(SPECS[0], "prefix_attn")
    again = build_variant(first.variant, "sm_120", cache, inspect=True)
    assert again.status == "cached"
    assert again.sass == first.sass == sass.counts(again.cubin)
    metas = [json.loads(p.read_text()) for p in cache.entries.glob("*/*/meta.json")]
    assert any(m.get("sass", {}).get("counts") == first.sass for m in metas)


def test_counts_classify_opcodes():
    text = "\n".join(f"        /*{i * 16:04x}*/  {op} ;" for i, op in enumerate([
        "HMMA.16816.F32.BF16 R4, R8, R12, R4", "QMMA.16832.F32.E4M3.E4M3 R8, R8, R12, RZ",
        "LDSM.16.M88.4 R4, [R2]", "UBLKCP.S.G [UR8], [UR6], UR4", "UTMALDG.2D [UR8], [UR4]",
        "@!P0 LDG.E.128.CONSTANT R20, desc[UR6][R2.64]", "LDG.E R2, desc[UR6][R2.64]",
        "@P1 LDG.E.U8 R2, desc[UR6][R2.64]", "STG.E.64 desc[UR6][R2.64], R4", "STL.64 [R1], R4",
        "LDL R4, [R1+0x8]", "BAR.SYNC.DEFER_BLOCKING 0x0", "MEMBAR.SC.GPU", "LDGDEPBAR", "EXIT"]))
    c = sass.count_text(text)
    assert c == {"HMMA": 1, "LDSM": 1, "UBLKCP": 1, "LDG": 3, "STG": 1, "LDL": 1, "STL": 1, "BAR": 1,
                 "LDG.128": 1, "LDG.32": 1, "LDG.8": 1, "QMMA": 1, "STG.64": 1, "UTMALDG": 1}
    assert sass.mma_count(c) == 2
    assert "UTMALDG 1" in sass.summary(c)  # tables say where tensor copies stage the KV


def test_the_tile_loop_text_holds_each_loop_instruction_with_its_operands(built_sm120):
    """bench/sass_dump.py diffs these between two trees: ptxas may reschedule the tile loop for code
    outside it (bench/NOTES.md v47), which the opcode counts alone hide."""
    text = sass.disassemble(built_sm120(SPECS[0], "prefix_attn").cubin, "--no-dataflow")
    loop = sass.tile_loop_text(text).splitlines()
    counts = sass.tile_loop(text)
    assert len(loop) == sum(counts.values()) and Counter(line.split()[0] for line in loop) == counts
    assert any(line.startswith("HMMA") and " R" in line for line in loop)  # operands kept
    assert "c[0x" not in "\n".join(loop)  # where the parameters sit is blanked
    # a made-up loop: a label, an MMA, a parameter load and the branch back
    made_up = ("        /*0000*/  MOV R1, c[0x0][0x28] ;\n.L_x_1:\n"
               "        /*0010*/  LDC.64 R10, c[0x0][0x288] ;\n        /*0020*/  HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
               "        /*0030*/  @P0 BRA `(.L_x_1) ;\n        /*0040*/  EXIT ;\n")
    assert sass.tile_loop_text(made_up) == ("LDC.64 R10, c[] ;\nHMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
                                            "BRA `(.L_x_1) ;\n")


def test_forced_register_cap_spills_and_fails_the_checks():
    variant = plan(load_spec(SPECS[0])).variant("prefix_attn")
    out = nvrtc.compile_cubin(render(variant), headers(), "sm_120", variant.variant_id, "prefix_attn.cu",
                              extra_options=REGISTER_CAP_32)
    b = BuiltKernel(variant, "sm_120", out.cubin, out.report, "compiled", 0.0, sass.counts(out.cubin))
    assert out.report.registers <= 32
    assert out.report.spill_bytes > 0
    assert b.sass["LDL"] > 0 and b.sass["STL"] > 0
    problems = b.problems()
    assert any("spills" in p for p in problems), problems
    assert any("LDL" in p and "STL" in p for p in problems), problems


def test_plan_demanding_too_many_ctas_per_sm_fails_the_checks():
    """A plan whose launch bounds ask 5 CTAs/SM (45 of sm_120's 48 warps): ptxas caps registers
    near 40 and spills, and the 96 KB of shared memory per CTA still allows only one CTA per SM."""
    variant = plan(load_spec(SPECS[0])).variant("prefix_attn")
    greedy = replace(variant, min_blocks=5)
    out = nvrtc.compile_cubin(render(greedy), headers(), "sm_120", greedy.variant_id, "prefix_attn.cu")
    b = BuiltKernel(greedy, "sm_120", out.cubin, out.report, "compiled", 0.0, sass.counts(out.cubin))
    problems = b.problems()
    assert b.occupancy.ctas_per_sm < 5 and "smem" in b.occupancy.limit
    assert any("CTAs/SM" in p for p in problems), problems
    assert any("spills" in p for p in problems), problems


def test_build_json_lists_sass_occupancy_and_limit(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(cache.root))
    spec = next(p for p in SPECS if p.stem == "glm5_sm120")
    result = CliRunner().invoke(app, ["build", str(spec), "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["kernel"] for r in rows} >= set(ATTENTION_KERNELS)
    for r in rows:
        assert r["arch"] == "sm_120"
        assert {"HMMA", "LDSM", "UBLKCP", "LDL", "STL", "BAR"} <= set(r["sass"])
        assert r["occupancy"]["ctas_per_sm"] >= 1 and r["occupancy"]["warps_per_sm"] >= 1
        assert r["limit"]


def test_inspect_dumps_sass(cache, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(cache.root))
    spec = next(p for p in SPECS if p.stem == "glm5_sm120")
    result = CliRunner().invoke(app, ["inspect", str(spec), "tree_attn", "--arch", "sm_120"])
    assert result.exit_code == 0, result.output
    assert ".target\tsm_120" in result.stdout or ".target sm_120" in result.stdout
    assert "HMMA.16816.F32.BF16" in result.stdout and "UBLKCP" in result.stdout
    bad = CliRunner().invoke(app, ["inspect", str(spec), "no_such_kernel"])
    assert bad.exit_code == 1 and "no kernel 'no_such_kernel'" in bad.output
