"""linear(x[T, K], w[N, K]) -> x @ w.T, bf16 in and out, fp32 accumulation, batch-invariant.

How invariance is achieved: every program owns whole output tiles and runs the full K loop
itself, one tl.dot per BLOCK_K chunk from k = 0 upwards, accumulating into one fp32 tile (no
split-K, no atomics). BLOCK_K is one constant for every T (a frozen tunable: it fixes the order
of the reduction). K_UNROLL only says how many consecutive BLOCK_K chunks one loop iteration
loads; the same dots run in the same order, so it changes no bits, by construction (the CPU
tests check this in the interpreter, where BLOCK_K itself does change bits).

The output tile (BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL) follows T, by bucket: on the
H200 a plain K-sequential Triton matmul gave identical bits for a row under all 214 tile
configurations tried and any M (bench_linear.py --sweep), because the tile only decides which rows and
columns share a program, never the order in which K is summed. The contract checks this on
every call shape (rows of T = 1 ... 4096 against the full batch), and the benchmark checks
every configuration in CONFIG at M = 1 against M = 4096.

Measured on the H200 (benchmarks/results/linear_h200_sweep*.md): loading 128 of K per iteration
is 1.1-1.2x faster than 64 at M <= 256 (more bytes in flight) and BLOCK_K = 64 is faster from
M = 1024 on (BLOCK_K = 128 at 1.42-1.52x cuBLAS there); BLOCK_K = 64 with K_UNROLL 2 for the
small buckets gets both: geomean 1.20x cuBLAS over 42 cells, 1.07x at M <= 64.

Backward: dx = dy @ w and dw = dy.T @ x are the same kernel on strided views (dx reduces over
N, dw over the tokens, both K-sequential with the same BLOCK_K), so gradients are
deterministic and dx rows are batch-invariant too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET

#: allowed values; per-bucket keys are <bucket>_<name>, buckets by the number of rows M
TUNABLES = {
    "BLOCK_K": (32, 64, 128),
    "M8_BLOCK_M": (16, 32, 64, 128),
    "M8_BLOCK_N": (16, 32, 64, 128, 256),
    "M8_num_warps": (2, 4, 8),
    "M8_K_UNROLL": (1, 2, 4),
    "M8_num_stages": (2, 3, 4, 5, 6, 8),
    "M64_BLOCK_M": (16, 32, 64, 128),
    "M64_BLOCK_N": (16, 32, 64, 128, 256),
    "M64_num_warps": (2, 4, 8),
    "M64_K_UNROLL": (1, 2, 4),
    "M64_num_stages": (2, 3, 4, 5, 6, 8),
    "M256_BLOCK_M": (16, 32, 64, 128),
    "M256_BLOCK_N": (16, 32, 64, 128, 256),
    "M256_num_warps": (2, 4, 8),
    "M256_K_UNROLL": (1, 2, 4),
    "M256_num_stages": (2, 3, 4, 5, 6, 8),
    "M1024_BLOCK_M": (16, 32, 64, 128, 256),
    "M1024_BLOCK_N": (32, 64, 128, 256),
    "M1024_num_warps": (4, 8),
    "M1024_K_UNROLL": (1, 2, 4),
    "M1024_num_stages": (2, 3, 4, 5, 6),
    "MBIG_BLOCK_M": (32, 64, 128, 256),
    "MBIG_BLOCK_N": (32, 64, 128, 256),
    "MBIG_num_warps": (4, 8),
    "MBIG_K_UNROLL": (1, 2, 4),
    "MBIG_num_stages": (2, 3, 4, 5, 6),
}

#: chosen offline on the H200 by `benchmarks/bench_linear.py --sweep` (benchmarks/results/linear_h200_sweep.md):
#: per bucket the tile with the lowest geomean time ratio to cuBLAS over the six projection shapes
CONFIG = {
    "BLOCK_K": 64,
    "M8_BLOCK_M": 16,
    "M8_BLOCK_N": 64,
    "M8_num_warps": 4,
    "M8_num_stages": 8,
    "M8_K_UNROLL": 2,
    "M64_BLOCK_M": 64,
    "M64_BLOCK_N": 32,
    "M64_num_warps": 4,
    "M64_num_stages": 6,
    "M64_K_UNROLL": 2,
    "M256_BLOCK_M": 64,
    "M256_BLOCK_N": 128,
    "M256_num_warps": 4,
    "M256_num_stages": 4,
    "M256_K_UNROLL": 2,
    "M1024_BLOCK_M": 128,
    "M1024_BLOCK_N": 128,
    "M1024_num_warps": 8,
    "M1024_num_stages": 3,
    "M1024_K_UNROLL": 1,
    "MBIG_BLOCK_M": 128,
    "MBIG_BLOCK_N": 128,
    "MBIG_num_warps": 8,
    "MBIG_num_stages": 3,
    "MBIG_K_UNROLL": 1,
}

#: (largest M, bucket) in increasing order; larger M uses "MBIG"
M_BUCKETS = ((8, "M8"), (64, "M64"), (256, "M256"), (1024, "M1024"))

#: programs that share a BLOCK_N column of the weight run next to each other (L2 reuse)
GROUP_M = 8


@triton.jit(do_not_specialize=["M"])
def _linear_fwd_kernel(
    a_ptr,  # [M, K] rows to project (x, dy or dy.T), any strides
    b_ptr,  # [N, K] one row per output column (w, w.T or x.T), any strides
    c_ptr,  # [M, N] output
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_UNROLL: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    o_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    # rows/columns past the edge re-read a valid one (unmasked, pipelined loads); never stored
    o_am = o_m % M
    o_bn = o_n % N
    p_a = a_ptr + o_am[:, None] * stride_am + o_k[None, :] * stride_ak  # [BM, BK]
    p_b = b_ptr + o_bn[None, :] * stride_bn + o_k[:, None] * stride_bk  # [BK, BN]

    b_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the whole reduction, one dot per chunk k = 0, BLOCK_K, 2 BLOCK_K, ... in order: nothing depends on M.
    # A fully masked chunk past the end adds exact zeros to an accumulator that is never -0.
    for k in range(0, tl.cdiv(K, BLOCK_K * K_UNROLL)):
        for u in tl.static_range(K_UNROLL):
            if EVEN_K:
                b_a = tl.load(p_a + u * BLOCK_K * stride_ak)
                b_b = tl.load(p_b + u * BLOCK_K * stride_bk)
            else:
                m_k = o_k < K - (k * K_UNROLL + u) * BLOCK_K
                b_a = tl.load(p_a + u * BLOCK_K * stride_ak, mask=m_k[None, :], other=0.0)
                b_b = tl.load(p_b + u * BLOCK_K * stride_bk, mask=m_k[:, None], other=0.0)
            if UPCAST:
                # the interpreter's bf16 tl.dot is wrong; fp32 operands are exact there
                b_acc = tl.dot(b_a.to(tl.float32), b_b.to(tl.float32), b_acc)
            else:
                b_acc = tl.dot(b_a, b_b, b_acc)
        p_a += BLOCK_K * K_UNROLL * stride_ak
        p_b += BLOCK_K * K_UNROLL * stride_bk

    p_c = c_ptr + o_m[:, None] * stride_cm + o_n[None, :] * stride_cn
    m_c = (o_m[:, None] < M) & (o_n[None, :] < N)
    tl.store(p_c, b_acc.to(c_ptr.dtype.element_ty), mask=m_c)


def _bucket(M: int) -> str:
    for limit, name in M_BUCKETS:
        if M <= limit:
            return name
    return "MBIG"


def _tile(M: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL) for M rows: any may follow M, none changes bits."""
    b = _bucket(M)
    return tuple(CONFIG[f"{b}_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "K_UNROLL"))


def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    tile: tuple[int, int, int, int, int] | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """a[M, K] @ b[N, K].T -> [M, N] in `out_dtype` (default a's), any strides.

    `tile` and `block_k` override CONFIG (the benchmark's offline sweep uses them); the entry
    point never passes them.
    """
    M, K = a.shape
    N, K2 = b.shape
    if K != K2:
        raise ValueError(f"linear: inner dims differ: {tuple(a.shape)} @ {tuple(b.shape)}.T")
    c = torch.empty((M, N), device=a.device, dtype=out_dtype or a.dtype)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL = tile or _tile(M)
    BLOCK_K = block_k or CONFIG["BLOCK_K"]
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _linear_fwd_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, K_UNROLL=K_UNROLL, GROUP_M=GROUP_M,
        EVEN_K=K % (BLOCK_K * K_UNROLL) == 0, UPCAST=INTERPRET,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return c


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _matmul(x, w)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            # dx[T, K] = dy[T, N] @ w[N, K]: reduce over N, K-sequential, rows batch-invariant
            dx = _matmul(dy, w.t())
        if ctx.needs_input_grad[1]:
            # dw[N, K] = dy.T[N, T] @ x[T, K]: reduce over the tokens in order, deterministic
            dw = _matmul(dy.t(), x.t(), out_dtype=w.dtype)
        return dx, dw


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x[..., K] @ w[N, K].T -> [..., N]; a row's bits never depend on the other rows."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and w {tuple(w.shape)} do not match (w is [N, K])")
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        y = LinearFunction.apply(x2, w)
    else:
        y = _matmul(x2, w)
    return y.reshape(*x.shape[:-1], w.shape[0])
