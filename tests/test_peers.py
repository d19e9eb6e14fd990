"""The benchmark's peers (bench/peers.py) on the CPU: the chain each peer attends to is the
attention kgen's reference computes for a chain tree, kgen's own inputs stay untouched, and a
peer that cannot run gets a reason instead of failing the benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kgen
from bench import peers
from bench import run as bench_run
from kgen import reference
from kgen.inputs import make_verify_inputs

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"


@pytest.fixture
def glm5():
    return kgen.load_spec(SPEC_DIR / "glm5_sm120.yaml")


def _chain_inputs(spec, trees, lens, page, seed):
    g = torch.Generator().manual_seed(seed)
    return make_verify_inputs(spec, trees, lens, page_size=page, tree_kind="chain", generator=g,
                              num_pages=bench_run.pool_pages(lens, trees, page, True))


@pytest.mark.parametrize("page", [1, 16, 64])
def test_chain_kv_is_the_causal_attention_of_a_chain_tree(glm5, page, seed):
    """Attention over what a peer reads (its pages, its lengths, a causal mask) equals kgen's
    reference verify attention on a chain tree; the pages it reads hold no NaN (whole pages
    included); kgen's own view of the inputs is unchanged."""
    trees, lens = [5, 16, 0, 3], [100, 0, 7, 130]
    x = _chain_inputs(glm5, trees, lens, page, seed)
    ref_o, ref_lse = x.verify_ref()
    kv = peers.chain_kv(x)
    assert kv.kv_lens.tolist() == [n + t for n, t in zip(lens, trees)]
    o_again, _ = x.verify_ref()
    torch.testing.assert_close(o_again, ref_o, rtol=0, atol=0)  # kgen's slots untouched
    qo, indptr = x.qo_indptr.tolist(), kv.kv_indptr.tolist()
    for b, n in enumerate(kv.kv_lens.tolist()):
        pages = kv.pages[kv.kv_indices[indptr[b]:indptr[b + 1]].long()].reshape(-1, x.q.shape[-1])
        assert pages.shape[0] >= n and not pages.isnan().any()
        assert (pages[n:] == 0).all()
        s, e = qo[b], qo[b + 1]
        visible = torch.arange(n) <= (lens[b] + torch.arange(e - s)).unsqueeze(1)  # causal: query i sees L + i
        o, lse = reference.attend(x.q[s:e], pages[:n], visible, x.scale, x.value_dim)
        torch.testing.assert_close(o, ref_o[s:e])
        torch.testing.assert_close(lse, ref_lse[s:e])


def test_chain_kv_of_decode_rows_is_the_prefix(glm5, seed):
    x = _chain_inputs(glm5, [1, 1], [300, 64], 64, seed)
    kv = peers.chain_kv(x, with_tree=False)
    assert kv.kv_lens.tolist() == [300, 64]
    ref_o, _ = x.prefix_ref()
    table = peers.block_table(kv)
    assert table.shape == (2, 5) and table.dtype == torch.int32
    for b, n in enumerate([300, 64]):
        keys = kv.pages[table[b].long()].reshape(-1, x.q.shape[-1])[:n]
        o, _ = reference.attend(x.q[b:b + 1], keys, torch.ones(1, n, dtype=torch.bool), x.scale, x.value_dim)
        torch.testing.assert_close(o, ref_o[b:b + 1])


def test_chain_kv_says_when_the_pool_is_full(glm5, seed):
    g = torch.Generator().manual_seed(seed)
    x = make_verify_inputs(glm5, [16], [64], page_size=16, generator=g, num_pages=4)  # all 4 pages hold the prefix
    with pytest.raises(peers.PeerError, match="free pages"):
        peers.chain_kv(x)


def test_peer_choice_and_reasons(glm5):
    assert peers.default_peers("sm_90") == ("flashinfer_fa3", "flashmla")
    assert peers.default_peers("sm_120") == ("flashinfer_fa2",)
    assert peers.flashinfer_for("sm_90") == "flashinfer_fa3" and peers.flashinfer_for("sm_120") == "flashinfer_fa2"
    assert peers.parse_peers("none", "sm_90") == () and peers.parse_peers("all", "sm_120") == peers.PEERS
    assert peers.parse_peers("flashmla, flashinfer_fa2", "sm_90") == ("flashmla", "flashinfer_fa2")
    with pytest.raises(ValueError, match="unknown peer flashattn"):
        peers.parse_peers("flashattn", "sm_90")
    assert "sm_90 only" in peers.unavailable("flashinfer_fa3", glm5, 1, 12)
    assert "sm_90 only" in peers.unavailable("flashmla", glm5, 64, 12)
    assert "page size 64" in peers.unavailable("flashmla", glm5, 1, 9)
    fp8 = kgen.load_spec(SPEC_DIR / "glm5_fp8_sm120.yaml")
    assert "bf16 KV only" in peers.unavailable("flashinfer_fa2", fp8, 1, 9)


def test_a_missing_package_is_a_reason(glm5, monkeypatch):
    """With the package not importable, the peer is skipped with the import error's first line."""
    import builtins

    real = builtins.__import__

    def no_peers(name, *args, **kwargs):
        if name.split(".")[0] in ("flashinfer", "flash_mla"):
            raise ModuleNotFoundError(f"No module named '{name}'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peers)
    assert peers.unavailable("flashinfer_fa2", glm5, 1, 9) == "ModuleNotFoundError: No module named 'flashinfer'"
    assert peers.unavailable("flashmla", glm5, 64, 9) == "ModuleNotFoundError: No module named 'flash_mla'"


def test_shapes_option():
    assert bench_run.parse_shapes("issue19") == bench_run.ISSUE19
    assert bench_run.parse_shapes("1x131072x16x8, 32x4096x1x16") == ((1, 131072, 16, 8), (32, 4096, 1, 16))
    with pytest.raises(Exception, match="BxLxTxH"):
        bench_run.parse_shapes("1x2x3")
    spec = kgen.load_spec(SPEC_DIR / "glm5_sm120.yaml")
    shapes = bench_run.grid(spec, quick=True, page_size=64, heads=(), trees=(), contexts=(), batches=(),
                            decode=False, shapes=bench_run.ISSUE19)
    assert len(shapes) == 9 and all(not s.decode and s.P == 64 for s in shapes)  # two decode rows left out
    assert bench_run.Shape(16, 33, 32768, 16, 64) in shapes
    both = bench_run.grid(spec, quick=True, page_size=1, heads=(), trees=(), contexts=(), batches=(), decode=True,
                          shapes=bench_run.ISSUE19)
    assert len(both) == len(bench_run.QUICK) + 11 - 3  # 3 of the quick shapes are in the table too
    assert len(set(both)) == len(both)


def test_sparse_reference_attends_to_the_listed_rows_only(seed):
    from kgen.fp8 import quantize_rows
    from kgen.reference import dequantize_scaled_rows

    g = torch.Generator().manual_seed(seed)
    rows = quantize_rows(torch.randn(128, 576, generator=g).to(torch.bfloat16), 512)
    assert rows.shape == (128, peers.DSA_ROW_BYTES)
    q = torch.randn(3, 8, 576, generator=g).to(torch.bfloat16)
    lists = torch.tensor([[5, 70, -1, 9], [-1, -1, -1, -1], [127, 0, 64, 1]], dtype=torch.int32)
    o = peers.sparse_reference(q, rows, lists, scale=0.04)
    keys = dequantize_scaled_rows(rows, 512)
    for i, listed in enumerate(([5, 70, 9], [], [127, 0, 64, 1])):
        if not listed:
            assert (o[i] == 0).all()
            continue
        logits = 0.04 * q[i].double() @ keys[listed].T
        torch.testing.assert_close(o[i], torch.softmax(logits, -1) @ keys[listed, :512])


def test_table_has_a_column_per_peer_timed():
    from rich.console import Console

    row = dict(mode="verify", H=8, T=16, L=131072, B=1, page_size=64, sets=2, us=100.0, us_prefix=None, us_tree=None,
               us_triton=None, us_flashinfer_fa3=93.3, us_flashinfer_fa2=None, us_flashmla=79.4, kv_tbps=1.5,
               tflops=300.0, floor_us=56.0, bound="compute", pct_floor=56.0, pct_floor_gemm=47.0,
               speedup_vs_triton=None, speedup_vs_flashinfer=0.933, speedup_vs_flashmla=0.794, notes=[])

    def text(peer_names):
        console = Console(width=400, record=True)
        console.print(bench_run.table([row], "t", peer_names))
        return console.export_text()

    both = text(("flashinfer_fa3", "flashmla"))
    for header in ("FlashInfer fa3 µs", "FlashMLA µs", "× FlashInfer", "× FlashMLA", "% GEMM floor"):
        assert header in both
    assert "93.3" in both and "0.79" in both
    none = text(())
    assert "FlashInfer" not in none and "FlashMLA" not in none and "% GEMM floor" in none
    line = bench_run._progress(row, ("flashinfer_fa3", "flashmla"))
    assert "FlashInfer fa3 93.3" in line and "× FlashMLA 0.79" in line and "47.0% of GEMM floor" in line


def test_kgen_bench_names_a_bad_peer_in_one_line():
    from typer.testing import CliRunner

    from kgen.cli import app

    result = CliRunner().invoke(app, ["bench", str(SPEC_DIR / "glm5_sm120.yaml"), "--quick", "--peers", "flashattn"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "unknown peer flashattn" in result.output and len(result.output.strip().splitlines()) == 1
