"""SGLang's Triton `extend_attention_fwd`, called as SGLang's Triton backend calls it for
TARGET_VERIFY on an absorbed-MLA model: the baseline kgen is measured against.

Where the file comes from (first found wins):
1. env KGEN_SGLANG_EXTEND_ATTENTION: the extend_attention.py file itself, a folder holding it
   (directly or under its sglang/... path), or an sglang wheel (the file is extracted from it);
2. an installed sglang's copy of the file (found without importing sglang);
3. this checkout's git-ignored .sglang_extend/extend_attention.py (the one file, small enough to
   carry to a GPU machine), then .sglang_whl/ (`pip download --no-deps sglang==0.5.23 -d .sglang_whl`).

sglang 0.5.23 moved the file to sglang/kernels/ops/attention/extend_attention.py; older releases
keep it under sglang/srt/layers/attention/triton_ops/. The file alone is loaded with importlib
(never the whole sglang package, whose import pulls in half of its dependencies) after registering
minimal stand-ins for the few sglang names it imports. They answer for a CUDA GPU: is_cuda() True,
every ROCm query False, every `envs.X.get()` False (0.5.23 reads only ROCm-only flags there), and
two trivial helpers re-implemented (_extract_kv_strides: the pool's strides; unpack_aux_tensors:
no score_mod). They are removed from sys.modules once the file is loaded. No SGLang code is
copied into this repository.

What TritonVerify passes (SGLang 0.5.23 triton_backend.py, forward_extend, TARGET_VERIFY):
  q_extend [sum T, H, 576], k_extend [sum T, 1, 576] (the tree tokens' latent rows),
  v_extend [sum T, 1, 512] (their first 512 dims, made contiguous as the backend does),
  o_extend [sum T, H, 512]; k_buffer = the KV pool viewed [slots, 1, 576] and v_buffer its
  [slots, 1, 512] view (no copy); qo_indptr; kv_indptr = cumsum of prefix lengths (token level);
  kv_indices = token-level slots, int64 as the backend allocates them; custom_mask = per request
  a row-major [T, L + T] bool block (prefix columns True, tree columns = the tree mask);
  mask_indptr = cumsum(T * (L + T)); is_causal False; max_len_extend = max T; k_scale = v_scale =
  1.0; sm_scale = the spec's softmax scale; skip_prefix_custom_mask True; page_size = P (the
  kernel then addresses slot // P, slot % P: the same rows); lse_extend only for the cross-check.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import torch

from kgen import env

ENV = "KGEN_SGLANG_EXTEND_ATTENTION"
REL_PATHS = (
    "sglang/kernels/ops/attention/extend_attention.py",  # sglang >= 0.5.2x
    "sglang/srt/layers/attention/triton_ops/extend_attention.py",  # older releases
)
REPO = Path(__file__).resolve().parents[1]


class BaselineError(RuntimeError):
    """The Triton baseline cannot be found or loaded."""


# ---- locating and loading -------------------------------------------------------------------


def _from_wheel(wheel: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for rel in REL_PATHS:
            if rel in names:
                dest = Path(tempfile.mkdtemp(prefix="kgen_sglang_")) / "extend_attention.py"
                dest.write_bytes(z.read(rel))
                return dest
    raise BaselineError(f"{wheel}: no extend_attention.py inside (looked for {', '.join(REL_PATHS)})")


def _from_path(p: Path) -> Path | None:
    if p.is_file():
        return _from_wheel(p) if p.suffix == ".whl" else p
    if p.is_dir():
        for cand in [p / "extend_attention.py", *(p / rel for rel in REL_PATHS)]:
            if cand.is_file():
                return cand
        wheels = sorted(p.glob("sglang-*.whl"))
        if wheels:
            return _from_wheel(wheels[-1])
    return None


def _installed_file() -> Path | None:
    """extend_attention.py of an installed sglang, found without importing sglang."""
    try:
        found = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    for root in (found.submodule_search_locations or []) if found else []:
        for rel in REL_PATHS:
            cand = Path(root).parent / rel
            if cand.is_file():
                return cand
    return None


def _stand_ins() -> dict[str, dict]:
    hip = torch.version.hip is not None

    class _Flag:
        def __init__(self, name: str):
            self.name = name

        def get(self):
            return False

    class _Envs:
        def __getattr__(self, name: str):
            return _Flag(name)

    def _extract_kv_strides(buf, page_size: int):
        if buf.ndim != 3:
            raise ValueError(f"unexpected KV buffer ndim={buf.ndim}, shape={buf.shape}")
        return buf.stride(0), buf.stride(1), buf.stride(0) * page_size, buf.stride(0)

    def unpack_aux_tensors(score_mod, aux_tensors):
        if score_mod is not None:
            raise NotImplementedError("kgen's stand-in for sglang's score_mod supports score_mod=None only")
        return None, 0, 0, 0

    return {
        "sglang.srt.utils": dict(is_cuda=lambda: not hip and torch.cuda.is_available(), is_hip=lambda: hip,
                                 is_gfx95_supported=lambda: False, is_gfx1250_supported=lambda: False,
                                 get_device_core_count=lambda *a, **k: torch.cuda.get_device_properties(0)
                                 .multi_processor_count),
        "sglang.srt.environ": dict(envs=_Envs()),
        "sglang.kernels.ops.attention.decode_attention": dict(_extract_kv_strides=_extract_kv_strides),
        "sglang.kernels.ops.attention.score_mod": dict(unpack_aux_tensors=unpack_aux_tensors),
    }


def _load_file(path: Path):
    """Exec extend_attention.py with stand-in sglang modules registered only while it loads."""
    registered = []
    for full, attrs in _stand_ins().items():
        parts = full.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                mod = types.ModuleType(name)
                mod.__path__ = []  # a package, so submodules resolve
                sys.modules[name] = mod
                registered.append(name)
                if i > 1:
                    setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], mod)
        for k, v in attrs.items():
            setattr(sys.modules[full], k, v)
    try:
        spec = importlib.util.spec_from_file_location("kgen_bench_sglang_extend_attention", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:
        raise BaselineError(f"{path}: it imports something kgen's sglang stand-ins do not provide ({e}); "
                            f"install sglang or add the name to bench/baseline.py _stand_ins()") from None
    finally:
        for name in registered:
            sys.modules.pop(name, None)
    return module


def load_extend_attention():
    """(extend_attention_fwd, the file it came from)."""
    env_path = env.path(ENV)
    if env_path:
        path = _from_path(env_path)
        if path is None:
            raise BaselineError(f"{ENV}={env_path}: no extend_attention.py there (a file, a folder or an sglang wheel)")
    else:
        path = _installed_file() or _from_path(REPO / ".sglang_extend") or _from_path(REPO / ".sglang_whl")
        if path is None:
            raise BaselineError(f"SGLang's extend_attention.py not found: set {ENV} to the file, install sglang, put "
                                f"it in {REPO / '.sglang_extend'}/, or `pip download --no-deps sglang==0.5.23 -d "
                                f"{REPO / '.sglang_whl'}`")
    return _load_file(path).extend_attention_fwd, str(path)


# ---- the TARGET_VERIFY call -----------------------------------------------------------------


def token_slots(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens: torch.Tensor, page_size: int):
    """Token-level slots of every request's prefix, concatenated (int64): token t of request b
    sits at kv_indices[kv_indptr[b] + t // P] * P + t % P (DESIGN §5)."""
    lens = kv_lens.long()
    req = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    t = torch.arange(req.numel(), device=lens.device) - (lens.cumsum(0) - lens)[req]
    return kv_indices.long()[kv_indptr.long()[req] + t // page_size] * page_size + t % page_size


def custom_mask(tree_mask: torch.Tensor, qo_indptr: list[int], kv_lens: list[int]):
    """SGLang's verify mask: per request a row-major [T, L + T] bool block, flattened and
    concatenated, with mask_indptr = cumsum(T * (L + T)). Prefix columns are all True."""
    sizes = [(qo_indptr[b + 1] - qo_indptr[b]) * (kv_lens[b] + qo_indptr[b + 1] - qo_indptr[b])
             for b in range(len(kv_lens))]
    flat = torch.ones(sum(sizes), dtype=torch.bool, device=tree_mask.device)
    start = 0
    j = None
    for b, size in enumerate(sizes):
        s, e, length = qo_indptr[b], qo_indptr[b + 1], kv_lens[b]
        n = e - s
        if n:
            j = torch.arange(n, device=tree_mask.device)
            visible = ((tree_mask[s:e].long()[:, j // 32] >> (j % 32)) & 1).bool()
            flat[start:start + size].view(n, length + n)[:, length:] = visible
        start += size
    indptr = torch.tensor([0, *sizes], device=tree_mask.device).cumsum(0).to(torch.int32)
    return flat, indptr


class TritonVerify:
    """One input set prepared for extend_attention_fwd (outside any timing); call it to run."""

    def __init__(self, fwd, inputs, *, with_lse: bool = False):
        q, kv = inputs.q, inputs.kv_cache
        total, heads, dim = q.shape
        dv = inputs.value_dim
        self.fwd = fwd
        self.o = torch.empty(total, heads, dv, dtype=q.dtype, device=q.device)
        self.lse = torch.empty(total, heads, dtype=torch.float32, device=q.device) if with_lse else None
        k_extend = inputs.k_tree.view(total, 1, dim)
        pool = kv.view(kv.shape[0], 1, dim)
        qo = inputs.qo_indptr.tolist()
        lens = inputs.kv_lens.tolist()
        mask, mask_indptr = custom_mask(inputs.tree_mask, qo, lens)
        args = dict(
            q_extend=q, k_extend=k_extend, v_extend=k_extend[..., :dv].contiguous(), o_extend=self.o,
            k_buffer=pool, v_buffer=pool[..., :dv], qo_indptr=inputs.qo_indptr,
            kv_indptr=torch.tensor([0, *lens], device=q.device).cumsum(0).to(torch.int32),
            kv_indices=token_slots(inputs.kv_indptr, inputs.kv_indices, inputs.kv_lens, inputs.page_size),
            custom_mask=mask, is_causal=False, mask_indptr=mask_indptr,
            max_len_extend=max(b - a for a, b in zip(qo, qo[1:])), k_scale=1.0, v_scale=1.0,
            sm_scale=inputs.scale, skip_prefix_custom_mask=True)
        params = inspect.signature(fwd).parameters
        if "page_size" in params:
            args["page_size"] = inputs.page_size
        elif inputs.page_size != 1:
            raise BaselineError("this extend_attention_fwd has no page_size argument; run with page size 1")
        if with_lse:
            if "lse_extend" not in params:
                raise BaselineError("this extend_attention_fwd cannot return the LSE (no lse_extend argument)")
            args["lse_extend"] = self.lse
        missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in args]
        if missing:
            raise BaselineError(f"extend_attention_fwd needs arguments bench/baseline.py does not know: {missing}")
        self.args = {k: v for k, v in args.items() if k in params}

    def __call__(self):
        self.fwd(**self.args)
        return self.o, self.lse
