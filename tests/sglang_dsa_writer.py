"""SGLang's own writer for the fp8 rows of its DSA KV pool (DSATokenToKVPool, DESIGN §11), run by
tests/test_fp8.py (CPU, in a fresh interpreter: `python sglang_dsa_writer.py IN OUT`) and
tests/test_dsa_pool_gpu.py (CUDA, in process: `write_rows`).

The writer is the pool's real method, `MLATokenToKVPool._write_mla_kv_buffer`, on a pool object that
has only the attributes that method reads: it quantizes with SGLang's Triton kernel
(`quantize_k_cache_separate`) and scatters with its row writer (`set_mla_kv_buffer_triton`).

On the CPU, Triton's interpreter runs the kernels. Its float -> e4m3 cast (triton 3.8,
runtime/interpreter.py `_convert_float`) is wrong where rounding carries out of the mantissa: it ORs
the carry into the exponent field, so e.g. 126.72 becomes 64 instead of 128 (about 2% of the
bytes of random data). The CPU run replaces that one cast, fp32 -> e4m3, with torch's (round to
nearest even, as the GPU's cvt.rn.satfinite does for in-range values, which the writer's clamp
guarantees); everything else is SGLang's code as the interpreter runs it. The GPU test runs the
writer unpatched.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def write_rows(k: torch.Tensor, loc: torch.Tensor, num_slots: int, latent: int = 512) -> torch.Tensor:
    """A [num_slots, 1, row bytes] uint8 pool layer with k [N, latent + rope] bf16 written at loc
    by SGLang's DSA pool writer; untouched slots stay 0."""
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate  # noqa: F401
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    pool = object.__new__(DSATokenToKVPool)  # what _write_mla_kv_buffer reads of a pool, no allocation
    pool.use_dsa = pool.dsa_kv_cache_store_fp8 = True
    pool.dcp_replicated = True  # one rank: loc addresses this rank's rows as given
    width = latent + latent // 128 * 4 + (k.shape[1] - latent) * 2
    buf = torch.zeros(num_slots, 1, width, dtype=torch.uint8, device=k.device)
    pool._write_mla_kv_buffer(buf, loc, k[:, None, :latent], k[:, None, latent:])
    return buf


def _patch_interpreter_e4m3_cast() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
            x = torch.from_numpy(np.ascontiguousarray(input).view(np.float32).copy())
            return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(input.shape)
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sglang_harness import stand_in_missing

    stand_in_missing()
    _patch_interpreter_e4m3_cast()
    src, dst = sys.argv[1:3]
    data = torch.load(src)
    torch.save(write_rows(data["k"], data["loc"], data["num_slots"]), dst)
