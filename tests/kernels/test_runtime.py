"""tik_kernels._runtime on a CPU machine: the interpreter is switched on, and its dot (tik_kernels/_interpreter.py)
has an order that does not follow the tile shape (np.matmul's did, with the BLAS library and the machine)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET

pytestmark = pytest.mark.skipif(not INTERPRET, reason="interpreter only")


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    om, ok, on = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + om[:, None] * K + ok[None, :])
    b = tl.load(b_ptr + ok[:, None] * N + on[None, :])
    tl.store(c_ptr + om[:, None] * N + on[None, :], tl.dot(a, b))


def _dot(a, b):
    c = torch.empty(a.shape[0], b.shape[1])
    _dot_kernel[(1,)](a, b, c, a.shape[0], a.shape[1], b.shape[1])
    return c


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_interpreter_dot_is_the_same_for_every_tile_shape(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 64, generator=g).to(dtype), torch.randn(64, 64, generator=g).to(dtype)
    full = _dot(a, b)
    assert (full.double() - a.double() @ b.double()).abs().max() < 1e-4
    for m in (1, 2, 4, 8):  # np.matmul on an AMD EPYC host gave other bits for m = 1, 2, 3, 5, ...
        assert torch.equal(_dot(a[:m].contiguous(), b)[:m].view(torch.int32), full[:m].view(torch.int32)), m
    for n in (16, 32):
        assert torch.equal(_dot(a, b[:, :n].contiguous()).view(torch.int32), full[:, :n].contiguous().view(torch.int32))


def _sequential(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The order the interpreter's dot defines: in fp32, one rounded product and one add per k, k = 0, 1, ..."""
    a, b = a.float(), b.float()
    acc = a[:, 0:1] * b[0:1, :]
    for k in range(1, a.shape[1]):
        acc += a[:, k:k + 1] * b[k:k + 1, :]
    return acc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_small_tiles_summed_at_once_give_the_bits_of_one_add_per_k(dtype):
    """A tile of at most 4096 outputs has its products summed by one reduction (`_order_defined_interpreter_dot`),
    a larger one adds a K-slice at a time: both are the sequential sum, bit for bit, so rows of a large tile equal
    the same rows computed as a small one; with NaN, infinities and signed zeros among the inputs."""
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(128, 32, generator=g) * 10.0 ** torch.randint(-4, 4, (128, 32), generator=g)).to(dtype)
    b = torch.randn(32, 128, generator=g).to(dtype)
    a[3, 5], a[7, 0], b[2, 9], b[4, 4] = float("nan"), float("inf"), -0.0, float("-inf")
    full = _dot(a, b)  # 128 x 128: K-slices
    assert torch.equal(full.view(torch.int32), _sequential(a, b).view(torch.int32))
    for m in (1, 8, 32):  # m x 128 <= 4096: at once
        rows = _dot(a[:m].contiguous(), b)
        assert torch.equal(rows.view(torch.int32), full[:m].view(torch.int32)), m
        assert torch.equal(rows.view(torch.int32), _sequential(a[:m], b).view(torch.int32)), m
