"""DESIGN §6's comparison of an attention output with the reference, and its tolerances."""

from __future__ import annotations

import torch

from .inputs import Dims, is_poison
from .spec import Spec


# fp8 KV against the reference on the dequantized cache (what the kernel is asked to compute). With
# f16 MMAs only the cache rounds: DESIGN §6's bf16 tolerances hold. With e4m3 MMAs Q and P also
# pass through e4m3. e4m3 keeps 3 mantissa bits, so each q_i is off by ~2.5% rms
# and a logit by ~0.025 * scale * sqrt(D) * |q_i| |k_i| rms: ~0.04 on unit-normal inputs, whose
# largest logits reach ~6. o: ~3-4% relative L2 (bench/NOTES.md v6); lse: the rounding of a row's
# few dominant logits, up to ~0.15 over thousands of rows, so the bound sits at ~6 sigma.
FP8_O_TOL = 6e-2
FP8_LSE_TOL = 2.5e-1


def tolerances(spec_or_dims: Spec | Dims) -> dict[str, float]:
    """assert_close_attention's tolerances for a spec: DESIGN §6's, wider ones for e4m3 MMAs."""
    if Dims.of(spec_or_dims).mma == "e4m3":
        return {"o_tol": FP8_O_TOL, "lse_tol": FP8_LSE_TOL}
    return {}


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(mask.nonzero()[0].tolist())


def assert_all_written(t: torch.Tensor, name: str = "output") -> None:
    """Every element of a poisoned output was overwritten."""
    left = is_poison(t)
    if left.any():
        raise AssertionError(f"{name}: {int(left.sum())} of {t.numel()} elements still hold the poison "
                             f"(never written), first at {_first(left)}")


def assert_close_attention(o, lse, o_ref, lse_ref, *, o_tol: float = 1e-2, lse_tol: float = 1e-3,
                           row_tol: float | None = None, what: str = "attention") -> None:
    """DESIGN §6: NaN never passes and -inf positions of lse must match the reference exactly
    (rows that see nothing must have o = 0); then ||o - ref|| / ||ref|| <= o_tol over all of o,
    and max |lse - ref| / (|ref| + 1) <= lse_tol over finite lse. Also every (token, head) row's
    own relative L2 error must stay <= row_tol (default 5 * o_tol), so one broken row cannot hide
    in the average."""
    row_tol = 5 * o_tol if row_tol is None else row_tol
    if tuple(o.shape) != tuple(o_ref.shape) or tuple(lse.shape) != tuple(lse_ref.shape):
        raise AssertionError(f"{what}: shapes o {tuple(o.shape)}, lse {tuple(lse.shape)} differ from the "
                             f"reference's o {tuple(o_ref.shape)}, lse {tuple(lse_ref.shape)}")
    o, lse = o.double(), lse.double()
    o_ref, lse_ref = o_ref.to(o.device, torch.float64), lse_ref.to(o.device, torch.float64)
    for name, t in (("o", o), ("lse", lse)):
        nan = torch.isnan(t)
        if nan.any():
            raise AssertionError(f"{what}: {name} has {int(nan.sum())} NaN of {t.numel()}, first at {_first(nan)}")
    if torch.isinf(o).any():
        raise AssertionError(f"{what}: o has {int(torch.isinf(o).sum())} infinite values, first at "
                             f"{_first(torch.isinf(o))}")
    if (lse == float("inf")).any():
        raise AssertionError(f"{what}: lse is +inf at {_first(lse == float('inf'))}")
    empty, empty_ref = lse == float("-inf"), lse_ref == float("-inf")
    if not torch.equal(empty, empty_ref):
        at = _first(empty != empty_ref)
        raise AssertionError(f"{what}: lse is {lse[at].item()} at (token, head) {at} where the reference has "
                             f"{lse_ref[at].item()}; {int((empty != empty_ref).sum())} positions disagree on -inf")
    nonzero = empty_ref & (o != 0).any(-1)
    if nonzero.any():
        raise AssertionError(f"{what}: {int(nonzero.sum())} rows see no key but o != 0, first at {_first(nonzero)}")

    ref_norm = torch.linalg.vector_norm(o_ref)
    err_norm = torch.linalg.vector_norm(o - o_ref)
    rel = (err_norm / ref_norm).item() if ref_norm > 0 else err_norm.item()
    row_ref = torch.linalg.vector_norm(o_ref, dim=-1)
    row_err = torch.linalg.vector_norm(o - o_ref, dim=-1)
    row_rel = torch.where(row_ref > 0, row_err / row_ref, row_err)
    worst = _first(row_rel == row_rel.max()) if row_rel.numel() else ()
    if rel > o_tol:
        raise AssertionError(f"{what}: o relative L2 error {rel:.3e} > {o_tol:.0e} (worst (token, head) {worst}: "
                             f"{row_rel[worst].item():.3e})")
    if row_rel.numel() and row_rel[worst] > row_tol:
        raise AssertionError(f"{what}: o row (token, head) {worst} has relative L2 error "
                             f"{row_rel[worst].item():.3e} > {row_tol:.0e} (whole-output error {rel:.3e})")

    finite = ~empty_ref
    lse_err = torch.where(finite, (lse - lse_ref).abs() / (lse_ref.abs() + 1), 0.0)
    if lse_err.numel() and lse_err.max() > lse_tol:
        at = _first(lse_err == lse_err.max())
        raise AssertionError(f"{what}: lse error {lse_err[at].item():.3e} > {lse_tol:.0e} relative to |ref| + 1 "
                             f"at (token, head) {at}: got {lse[at].item():.6f}, reference {lse_ref[at].item():.6f}")
