"""TIK's adjustments to Triton's CPU interpreter (`tik_kernels._runtime`), each with the same bits as Triton's own path:
a helper called from a kernel no longer patches `triton.language` again when the running launch has patched it
already (one scan per launch and module instead of one per call); integer-overflow checks that `device_assert` would
discard are not computed; the numpy dtype of a Triton type is looked up, not rebuilt; bf16 <-> fp32 casts without
subnormal inputs are bit shifts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import tik_kernels  # noqa: F401 (sets the interpreter up)
from tik_kernels._runtime import INTERPRET

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the interpreter's patches (CPU only)")


@triton.jit
def _scaled(x, s):
    return x * s + 1.0


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(4):  # a helper of this module, called every iteration, and the standard library's tl.sum
        x = tl.load(x_ptr + i * BLOCK + offs, mask=offs < n, other=0.0)
        acc += _scaled(x, 0.5 + i)
    tl.store(y_ptr + offs, acc / (tl.sum(acc, axis=0) + 3.0), mask=offs < n)


def _run(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(32, dtype=torch.float32)
    _kernel[(1,)](x, y, 32, BLOCK=32)
    return y


def test_helpers_skip_the_repeated_patch_with_the_same_bits(monkeypatch):
    from triton.runtime import interpreter as it

    assert getattr(it.InterpretedFunction.__call__, "_tik_once", False), "the patch is not installed"
    x = torch.randn(4 * 32, generator=torch.Generator().manual_seed(0))
    scans = []
    real = it._patch_lang
    monkeypatch.setattr(it, "_patch_lang", lambda fn: (scans.append(fn.__name__), real(fn))[1])
    fast = _run(x)
    # the launch, then the first tl.sum (its module sees tl.core, which the launch did not patch); not the 4 helpers
    assert len(scans) <= 2, scans
    assert scans[0] == "_kernel" and "_scaled" not in scans
    # Triton's own path: every helper call patches again
    monkeypatch.setattr(it.InterpretedFunction, "__call__", it.InterpretedFunction.__call__.__wrapped_original__)
    monkeypatch.setattr(it.GridExecutor, "__call__", it.GridExecutor.__call__.__wrapped_original__)
    scans.clear()
    slow = _run(x)
    assert scans.count("_scaled") == 4
    assert torch.equal(fast.view(torch.int32), slow.view(torch.int32))


@triton.jit
def _index_kernel(x_ptr, y_ptr, scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    i = tl.program_id(0) * BLOCK + offs
    wrapped = i * scale + 7 - offs  # int32 arithmetic that overflows for large scale: wraps, as on the GPU
    x = tl.load(x_ptr + i).to(tl.float32)
    tl.store(y_ptr + i, (x * 1.5 + wrapped.to(tl.float32)).to(tl.bfloat16))


def test_overflow_checks_off_with_the_same_bits(monkeypatch):
    import dataclasses

    from triton.runtime import interpreter as it

    assert it.interpreter_builder.options.sanitize_overflow is False, "the patch is not installed"
    assert it.interpreter_builder.options.debug is False
    x = torch.randn(64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    fast, slow = torch.empty_like(x), torch.empty_like(x)
    _index_kernel[(2,)](x, fast, 2**30 + 3, BLOCK=32)
    monkeypatch.setattr(it.interpreter_builder, "options",
                        dataclasses.replace(it.interpreter_builder.options, sanitize_overflow=True))
    _index_kernel[(2,)](x, slow, 2**30 + 3, BLOCK=32)
    assert torch.equal(fast.view(torch.int16), slow.view(torch.int16))


def _fp32_bits_of_every_exponent() -> np.ndarray:
    rng = np.random.default_rng(0)
    exponents = np.arange(256, dtype=np.uint32) << np.uint32(23)
    mantissas = np.concatenate([np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x7FFFFF], dtype=np.uint32),
                                rng.integers(0, 1 << 23, 56, dtype=np.uint32)])
    bits = (exponents[:, None] | mantissas[None, :]).ravel()
    return np.concatenate([bits, bits | np.uint32(1 << 31)])


def test_fast_bf16_fp32_casts_match_tritons_routine():
    from triton.runtime import interpreter as it

    fast, slow = it._convert_float, it._convert_float.__wrapped_original__
    assert getattr(fast, "_tik_fast", False), "the patch is not installed"
    every_bf16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    normal = every_bf16[~(((every_bf16 & 0x7F80) == 0) & ((every_bf16 & 0x7F) != 0))]
    fp32 = _fp32_bits_of_every_exponent()
    fp32_normal = fp32[~(((fp32 & 0x7F800000) == 0) & ((fp32 & 0x7FFFFF) != 0))]
    cases = [(every_bf16, tl.bfloat16, tl.float32), (normal, tl.bfloat16, tl.float32),
             (normal[:128].reshape(-1, 16)[::2, 1:], tl.bfloat16, tl.float32),
             (normal[5:6].reshape(()), tl.bfloat16, tl.float32),
             (fp32.view(np.float32), tl.float32, tl.bfloat16), (fp32_normal.view(np.float32), tl.float32, tl.bfloat16),
             (fp32_normal[:4096].view(np.float32).reshape(-1, 8)[::3, 1::2], tl.float32, tl.bfloat16)]
    for data, src, dst in cases:
        got, want = fast(data, src, dst, None), slow(data, src, dst, None)
        assert got.dtype == want.dtype and got.shape == want.shape, (src, dst, data.shape)
        assert np.array_equal(got, want), (src, dst, data.shape)
    # another rounding mode, or other types, go to Triton's routine unchanged
    data = fp32_normal.view(np.float32)
    assert np.array_equal(fast(data, tl.float32, tl.bfloat16, "rtne-mode"), slow(data, tl.float32, tl.bfloat16,
                                                                                   "rtne-mode"))
    assert np.array_equal(fast(data[:64], tl.float32, tl.float16, None), slow(data[:64], tl.float32, tl.float16, None))


def test_np_dtype_lookup_matches_tritons():
    from triton.runtime import interpreter as it

    fast, slow = it._get_np_dtype, it._get_np_dtype.__wrapped_original__
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [4, 8]) for t in scalars]
    types += [tl.block_type(tl.pointer_type(tl.float32), [16])]
    for _ in range(2):  # the second time from what the first kept
        for t in types:
            assert fast(t) == slow(t), t
