"""SwiGLU activation, batch-invariant: `silu_mul(x[..., 2F]) -> silu(x[..., :F]) * x[..., F:]`.

Layout: the last dim of x is [gate | up], the two halves of a fused gate_up projection (gate first,
as in Llama/Qwen3's `act_fn(gate_proj(x)) * up_proj(x)`).

Invariance: purely elementwise. Each element is computed in fp32 from its own gate and up value
(sigmoid as 1 / (1 + exp(-a))) and rounded once to the output dtype; nothing depends on T, on the
block an element falls in or on other tokens, so any BLOCK_T / BLOCK_F / num_warps gives the same bits.

Backward is elementwise too (no reduction): d_gate = g·up·σ(a)·(1 + a·(1 − σ(a))), d_up = g·silu(a).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import sm_count
from tik_kernels.ops._common import pdl_launch, pdl_start, round_to

#: FILL 1: BLOCK_T halves (down to 1) while the launch would have fewer programs than the GPU has SMs, so a decode
#: step's few tokens still spread over the GPU (H200, qwen3-0.6b decode, 64 x 3072: 48 programs took 4.6 us).
#: PDL: the forward launched with programmatic dependent launch (ops/_common.py), no bit changes
TUNABLES = {"BLOCK_T": (1, 2, 4, 8), "BLOCK_F": (256, 512, 1024, 2048, 4096), "num_warps": (1, 2, 4, 8),
            "FILL": (0, 1), "PDL": (0, 1)}
CONFIG = {"BLOCK_T": 4, "BLOCK_F": 1024, "num_warps": 4, "FILL": 1, "PDL": 1}


def _block_t(T: int, F: int, device: torch.device) -> int:
    """Tokens per program: CONFIG's, halved while FILL is on and the grid would leave SMs without a program."""
    bt = CONFIG["BLOCK_T"]
    if CONFIG.get("FILL"):
        sms = sm_count(device)
        while bt > 1 and triton.cdiv(T, bt) * triton.cdiv(F, CONFIG["BLOCK_F"]) < sms:
            bt //= 2
    return bt


@triton.jit
def silu_mul_math(b_a, b_b):
    """silu(a) * b in fp32, a and b fp32 (the gate and up values read from bf16): this operator's formula, also the
    epilogue of linear's `linear_silu_mul`, which must give this kernel's bits."""
    return b_a / (1.0 + tl.exp(-b_a)) * b_b


@triton.jit
def _silu_mul_fwd_kernel(
    x_ptr,  # [T, 2F] gate | up (row stride stride_x, unit column stride)
    y_ptr,  # [T, F] output, contiguous
    T,
    F,
    stride_x,
    BLOCK_T: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    o_t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    o_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m = (o_t < T)[:, None] & (o_f < F)[None, :]
    p_x = x_ptr + o_t[:, None] * stride_x + o_f[None, :]  # [BT, BF]
    b_a = tl.load(p_x, mask=m, other=0.0).to(tl.float32)  # gate
    b_b = tl.load(p_x + F, mask=m, other=0.0).to(tl.float32)  # up
    b_y = silu_mul_math(b_a, b_b)
    tl.store(y_ptr + o_t[:, None] * F + o_f[None, :], round_to(b_y, y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_mul_bwd_kernel(
    x_ptr,  # [T, 2F] forward input (row stride stride_x)
    g_ptr,  # [T, F] upstream gradient, contiguous
    dx_ptr,  # [T, 2F] input gradient, contiguous
    T,
    F,
    stride_x,
    BLOCK_T: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    o_t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    o_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m = (o_t < T)[:, None] & (o_f < F)[None, :]
    p_x = x_ptr + o_t[:, None] * stride_x + o_f[None, :]  # [BT, BF]
    b_a = tl.load(p_x, mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(p_x + F, mask=m, other=0.0).to(tl.float32)
    b_g = tl.load(g_ptr + o_t[:, None] * F + o_f[None, :], mask=m, other=0.0).to(tl.float32)
    b_sig = 1.0 / (1.0 + tl.exp(-b_a))
    b_da = b_g * b_b * b_sig * (1.0 + b_a * (1.0 - b_sig))
    b_db = b_g * b_a * b_sig
    p_dx = dx_ptr + o_t[:, None] * (2 * F) + o_f[None, :]
    tl.store(p_dx, round_to(b_da, dx_ptr.dtype.element_ty), mask=m)
    tl.store(p_dx + F, round_to(b_db, dx_ptr.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_mul: last dim {x.shape[-1]} is not even ([gate | up])")
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def silu_mul_fwd(x: torch.Tensor) -> torch.Tensor:
    x2 = _rows(x)
    T, F = x2.shape[0], x2.shape[1] // 2
    y = torch.empty((T, F), dtype=x.dtype, device=x.device)
    if T and F:
        bt = _block_t(T, F, x.device)
        grid = (triton.cdiv(T, bt), triton.cdiv(F, CONFIG["BLOCK_F"]))
        _silu_mul_fwd_kernel[grid](x2, y, T, F, x2.stride(0), BLOCK_T=bt, BLOCK_F=CONFIG["BLOCK_F"],
                                   num_warps=CONFIG["num_warps"], **pdl_launch(CONFIG.get("PDL"), x.device))
    return y.view(*x.shape[:-1], F)


def silu_mul_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    x2 = _rows(x)
    T, F = x2.shape[0], x2.shape[1] // 2
    g2 = g.reshape(T, F).contiguous()
    dx = torch.empty((T, 2 * F), dtype=x.dtype, device=x.device)
    if T and F:
        bt = _block_t(T, F, x.device)
        grid = (triton.cdiv(T, bt), triton.cdiv(F, CONFIG["BLOCK_F"]))
        _silu_mul_bwd_kernel[grid](x2, g2, dx, T, F, x2.stride(0), BLOCK_T=bt,
                                   BLOCK_F=CONFIG["BLOCK_F"], num_warps=CONFIG["num_warps"])
    return dx.view(x.shape)


class SiluMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return silu_mul_fwd(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (x,) = ctx.saved_tensors
        return silu_mul_bwd(g, x)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x[..., 2F] = [gate | up]; returns [..., F] in x's dtype."""
    return SiluMulFunction.apply(x)
