"""TIK's two adjustments to Triton's CPU interpreter (`tik_kernels._runtime`): a helper called from a kernel no longer
patches `triton.language` again when the running launch has patched it already, with the same bits as Triton's own
path and one scan per launch and module instead of one per call."""

from __future__ import annotations

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
