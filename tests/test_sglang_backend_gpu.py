"""The real KgenAttnBackend on a GPU against SGLang's real TritonAttnBackend, both built through
SGLang's attention registry on minimal model runners (tests/sglang_harness.py) with identical
pools: TARGET_VERIFY (random trees and chains) and DECODE batches with save_kv_cache=True,
eagerly and through kgen's backend's own CUDA-graph hooks (init_cuda_graph_state,
init_forward_metadata_out_graph before capture and before every replay) with a captured
torch.cuda.CUDAGraph replayed on new batches, padded ones included. Outputs match Triton's
(relative L2 <= 1e-2) and the stored KV rows are byte-equal to the ones Triton's backend stores.

Stood in for (stand_in_missing, printed): sgl_kernel, SGLang's compiled CUDA kernel package,
which the GPU machine lacks; nothing of SGLang itself. Run with bench/gpu_sglang.sh.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_harness import Captured, Harness, Step, gpu_ready, rel_l2  # noqa: E402

pytestmark = pytest.mark.gpu

MAX_BS, CONTEXT, DRAFT = 8, 4096, 64
TOL = 1e-2


@pytest.fixture(scope="module")
def harness(cuda):
    gpu_ready()
    return Harness(cuda, max_bs=MAX_BS, context_len=CONTEXT, draft_tokens=DRAFT)


@pytest.fixture(scope="module")
def pair(harness):
    """(kgen backend, its runner), (Triton backend, its runner): same config, separate pools."""
    rk, rt = harness.runner(), harness.runner()
    kgen_backend = harness.backend("kgen", rk)
    assert kgen_backend.kgen is not None, kgen_backend.kgen_off_reason
    return (kgen_backend, rk), (harness.backend("triton", rt), rt)


def random_step(harness, gen, n: int, longest: int, bs: int | None = None) -> Step:
    """n draft tokens per request (0: decode), 1..MAX_BS requests (or bs) of random lengths."""
    bs = bs or int(torch.randint(1, MAX_BS + 1, (1,), generator=gen))
    lens = torch.randint(0 if n else 1, longest + 1, (bs,), generator=gen).tolist()
    return Step(harness, lens, n, gen, chain=n > 0 and bool(torch.rand(1, generator=gen) < 0.2))


def run_eager(backend, runner, step: Step) -> torch.Tensor:
    step.load(runner)
    fb = step.forward_batch(runner)
    backend.init_forward_metadata(fb)
    q, k, v = step.inputs(runner.device)
    return backend.forward(q, k, v, runner.layer, fb, save_kv_cache=True)


def stored(runner, step: Step) -> torch.Tensor:
    return runner.token_to_kv_pool.get_key_buffer(0)[step.out_cache_loc.to(runner.device)]


def check(step: Step, got, want, rk, rt, what: str) -> None:
    rows = step.reference().shape[0]
    assert not torch.isnan(got[:rows]).any(), f"{what}: NaN in kgen's output"
    err = rel_l2(got[:rows], want[:rows].view(got[:rows].shape))
    assert err <= TOL, f"{what} (lens {step.lens}, N {step.n}): rel L2 vs Triton {err:.3g}"
    assert rel_l2(got[:rows], step.reference()) <= TOL, f"{what}: kgen vs the float64 reference"
    assert torch.equal(stored(rk, step).view(torch.int16), stored(rt, step).view(torch.int16)), \
        f"{what}: stored KV rows differ from Triton's"


@pytest.mark.parametrize("verify", [True, False], ids=["target_verify", "decode"])
def test_eager_forward_matches_sglangs_triton_backend(harness, pair, seed, verify):
    (kb, rk), (tb, rt) = pair
    gen = torch.Generator().manual_seed(seed)
    for i in range(12):
        n = [1, 4, 16, 33, 64, 7][i % 6] if verify else 0
        step = random_step(harness, gen, n, [40, 700, CONTEXT - DRAFT][i % 3])
        got = run_eager(kb, rk, step)
        assert kb.kgen_mode == ("verify" if verify else "decode")
        want = run_eager(tb, rt, step)
        check(step, got, want, rk, rt, f"batch {i}")


@pytest.mark.parametrize("verify", [True, False], ids=["target_verify", "decode"])
def test_cuda_graph_replays_through_the_backends_hooks_match_triton(harness, pair, seed, verify):
    """SGLang's protocol: init_cuda_graph_state once; out_graph(in_capture=True), capture the
    layer's forward; per step, new values into the captured batch's tensors, out_graph, replay."""
    (kb, rk), (tb, rt) = pair
    gen = torch.Generator().manual_seed(seed)
    n = 16 if verify else 0
    graph = Captured(kb, rk, Step(harness, [1] * MAX_BS, n, gen), MAX_BS)
    for r in range(9):
        step = random_step(harness, gen, n, [50, 900, CONTEXT - DRAFT][r % 3], bs=MAX_BS if r % 3 == 0 else None)
        out, = graph.replay(step)
        want = run_eager(tb, rt, step)
        check(step, out, want, rk, rt, f"replay {r} ({len(step.lens)} of {MAX_BS} requests)")
