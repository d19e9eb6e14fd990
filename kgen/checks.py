"""Host-side argument checks: a bad argument gets a ValueError/TypeError naming it and what was
expected, before any kernel can read out of bounds or return garbage."""

from __future__ import annotations

import torch


def tensor(name: str, t: object, *, dtype: torch.dtype | tuple[torch.dtype, ...], device: torch.device,
           shape: tuple[int | None, ...] | None = None, ndim: int | None = None) -> torch.Tensor:
    """Check a tensor's type, dtype, device, rank, sizes (None = any) and contiguity."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")
    rank = len(shape) if shape is not None else ndim
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-D tensor, got shape {tuple(t.shape)}")
    if shape is not None:
        for axis, (want, got) in enumerate(zip(shape, t.shape)):
            if want is not None and want != got:
                raise ValueError(f"{name}: expected size {want} in dim {axis}, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous())")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data must be 16-byte aligned (got a view at an odd offset)")
    return t


def kv_rows(name: str, t: object, *, dtype: torch.dtype | tuple[torch.dtype, ...], device: torch.device, width: int,
            rows: int | None = None) -> torch.Tensor:
    """A [rows, width] or [rows, 1, width] cache-like tensor, returned as [rows, width]."""
    if isinstance(t, torch.Tensor) and t.dim() == 3:
        if t.shape[1] != 1:
            raise ValueError(f"{name}: expected [rows, {width}] or [rows, 1, {width}], got shape {tuple(t.shape)}")
        t = t.view(t.shape[0], t.shape[2]) if t.is_contiguous() else t
    return tensor(name, t, dtype=dtype, device=device, shape=(rows, width))


def out_tensor(name: str, t: torch.Tensor | None, *, shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """A caller's preallocated output, checked, or a new one."""
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return tensor(name, t, dtype=dtype, device=device, shape=shape)


def indptr(name: str, t: object, *, length: int | None, device: torch.device) -> torch.Tensor:
    t = tensor(name, t, dtype=torch.int32, device=device, ndim=1)
    if length is not None and t.numel() != length:
        raise ValueError(f"{name}: expected batch + 1 = {length} entries, got {t.numel()}")
    if t.numel() < 1:
        raise ValueError(f"{name}: expected at least one entry (batch + 1)")
    return t


# The per-layer hot path: one combined test of a tensor that must match exactly; only a tensor
# that fails it goes through the full check above, which raises the message naming the problem.

def address(name: str, t: object, *, dtypes: tuple[torch.dtype, ...], device: torch.device,
            shape: tuple[int, ...]) -> int:
    """The device address of a tensor checked like tensor(): dtype in `dtypes`, exact shape."""
    if (isinstance(t, torch.Tensor) and t.dtype in dtypes and t.shape == shape and t.device == device
            and t.is_contiguous()):
        ptr = t.data_ptr()
        if not ptr % 16:
            return ptr
    return tensor(name, t, dtype=dtypes, device=device, shape=shape).data_ptr()


def rows_address(name: str, t: object, *, dtypes: tuple[torch.dtype, ...], device: torch.device, width: int,
                 rows: int | None = None) -> tuple[int, int]:
    """(device address, rows) of a tensor checked like kv_rows()."""
    if isinstance(t, torch.Tensor) and t.dtype in dtypes and t.device == device and t.is_contiguous():
        s = t.shape
        if ((len(s) == 2 or len(s) == 3 and s[1] == 1) and s[-1] == width and (rows is None or s[0] == rows)):
            ptr = t.data_ptr()
            if not ptr % 16:
                return ptr, s[0]
    t = kv_rows(name, t, dtype=dtypes, device=device, width=width, rows=rows)
    return t.data_ptr(), t.shape[0]
