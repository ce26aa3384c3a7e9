"""Fused residual add + RMSNorm, batch-invariant: `add_rmsnorm(x, residual, w, eps) -> (out, residual)`.

`residual_out = x + residual` (rounded to the activation dtype, as the bf16 add in a Llama/Qwen3
decoder layer), `out = rmsnorm(residual_out, w, eps)` with the Hugging Face cast order (x̂ rounded
to the activation dtype before the weight multiply). Any leading dims are flattened into rows.

Invariance: a row's result depends only on that row. Rows sit in a [BLOCK_R, BLOCK_H] tile with
BLOCK_H = next_pow2(H) covering the row; BLOCK_R and num_warps come from H only, never from the
number of rows, so each row's sum of squares is one `tl.sum` over axis 1 with the same reduction
tree whatever T is or where the row lands. Masked lanes contribute exact zeros.

Backward: d(residual_out) = g_residual + rmsnorm'(g_out) per row; it is the gradient of both x and
residual. dw = Σ_rows g_out·x̂: each program sums a fixed block of BWD_ROWS rows in order into a fp32
partial; the [P, H] partials are summed by `torch.sum(dim=0)` (fixed tree for a fixed shape, no
atomics): deterministic on rerun.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels.ops._common import pdl_launch, pdl_start, round_to

TUNABLES = {
    "TILE_ELEMS": (1024, 2048, 4096, 8192),
    "MAX_WARPS": (1, 2, 4, 8, 16),
    "BWD_ROWS": (32, 64, 128, 256),
    "PDL": (0, 1),
}
#: PDL: the forward launched with programmatic dependent launch (ops/_common.py), no bit changes
#: BWD_ROWS 32 (was 128): a trainer's minibatch of ~10.6k rows is 331 programs on 132 SMs instead of 83 (new dw
#: bits, deterministic); H100, qwen3-0.6b, 4 minibatch updates with rmsnorm's alike, a pass 0.458 s against 0.466
#: (results/train_profile_h100_qwen3-0.6b_s31_variants.md)
CONFIG = {"TILE_ELEMS": 4096, "MAX_WARPS": 8, "BWD_ROWS": 32, "PDL": 1}


@triton.jit
def _add_rmsnorm_fwd_kernel(
    x_ptr,  # [R, H] layer output (row stride stride_x, unit column stride)
    r_ptr,  # [R, H] incoming residual (row stride stride_r)
    w_ptr,  # [H] weight
    y_ptr,  # [R, H] normalized output, contiguous
    s_ptr,  # [R, H] outgoing residual x + residual, contiguous
    rstd_ptr,  # [R] fp32 1/rms per row, saved for backward
    R,
    H,
    stride_x,
    stride_r,
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    o_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    o_h = tl.arange(0, BLOCK_H)
    m_r = o_r < R
    m_h = o_h < H
    m = m_r[:, None] & m_h[None, :]
    b_x = tl.load(x_ptr + o_r[:, None] * stride_x + o_h[None, :], mask=m, other=0.0).to(tl.float32)  # [BR, BH]
    b_r = tl.load(r_ptr + o_r[:, None] * stride_r + o_h[None, :], mask=m, other=0.0).to(tl.float32)
    b_w = tl.load(w_ptr + o_h, mask=m_h, other=0.0).to(tl.float32)  # [BH]
    # the residual stream is stored in the activation dtype; the norm reads the rounded sum
    b_s = round_to(b_x + b_r, s_ptr.dtype.element_ty)
    tl.store(s_ptr + o_r[:, None] * H + o_h[None, :], b_s, mask=m)
    b_s = b_s.to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_s * b_s, axis=1) / H + eps)  # [BR]
    b_xn = round_to(b_s * b_rstd[:, None], y_ptr.dtype.element_ty).to(tl.float32)
    b_y = b_xn * b_w[None, :]
    tl.store(y_ptr + o_r[:, None] * H + o_h[None, :], round_to(b_y, y_ptr.dtype.element_ty), mask=m)
    tl.store(rstd_ptr + o_r, b_rstd, mask=m_r)


@triton.jit
def _add_rmsnorm_bwd_kernel(
    s_ptr,  # [R, H] saved residual sum, contiguous
    w_ptr,  # [H] weight
    g_ptr,  # [R, H] gradient of out, contiguous
    gs_ptr,  # [R, H] gradient of the outgoing residual, contiguous (unused without HAS_GS)
    rstd_ptr,  # [R] fp32 saved 1/rms
    ds_ptr,  # [R, H] gradient of x (and of residual), contiguous
    dw_part_ptr,  # [P, H] fp32 per-program partial weight gradients
    R,
    H,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BWD_ROWS: tl.constexpr,
    HAS_GS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, BLOCK_H)
    m_h = o_h < H
    b_w = tl.load(w_ptr + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_dw = tl.zeros([BLOCK_H], dtype=tl.float32)
    # the program's rows, in order, one tile of BLOCK_R rows at a time: a fixed summation order for dw
    for i in range(0, BWD_ROWS, BLOCK_R):
        o_r = pid * BWD_ROWS + i + tl.arange(0, BLOCK_R)
        m_r = o_r < R
        m = m_r[:, None] & m_h[None, :]
        o_2d = o_r[:, None] * H + o_h[None, :]
        b_s = tl.load(s_ptr + o_2d, mask=m, other=0.0).to(tl.float32)
        b_g = tl.load(g_ptr + o_2d, mask=m, other=0.0).to(tl.float32)
        b_rstd = tl.load(rstd_ptr + o_r, mask=m_r, other=0.0)
        b_xhat = b_s * b_rstd[:, None]  # [BR, BH]
        b_gw = b_g * b_w[None, :]
        b_c = tl.sum(b_gw * b_xhat, axis=1) / H  # [BR]
        b_ds = (b_gw - b_xhat * b_c[:, None]) * b_rstd[:, None]
        if HAS_GS:
            b_ds += tl.load(gs_ptr + o_2d, mask=m, other=0.0).to(tl.float32)
        tl.store(ds_ptr + o_2d, round_to(b_ds, ds_ptr.dtype.element_ty), mask=m)
        b_dw += tl.sum(b_g * b_xhat, axis=0)
    tl.store(dw_part_ptr + pid * H + o_h, b_dw, mask=m_h)


def _tile(H: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_H, num_warps) from the row width only."""
    block_h = triton.next_power_of_2(H)
    if block_h > 65536:
        raise ValueError(f"add_rmsnorm: row width {H} exceeds the single-block limit 65536")
    block_r = max(1, CONFIG["TILE_ELEMS"] // block_h)
    num_warps = max(1, min(CONFIG["MAX_WARPS"], block_r * block_h // 512))
    return block_r, block_h, num_warps


def _rows(x: torch.Tensor, H: int) -> torch.Tensor:
    x2 = x.reshape(-1, H)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def add_rmsnorm_fwd(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
    H = x.shape[-1]
    if residual.shape != x.shape:
        raise ValueError(f"add_rmsnorm: residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    if w.shape != (H,):
        raise ValueError(f"add_rmsnorm: weight shape {tuple(w.shape)} != ({H},)")
    x2, r2 = _rows(x, H), _rows(residual, H)
    R = x2.shape[0]
    y = torch.empty((R, H), dtype=x.dtype, device=x.device)
    s = torch.empty((R, H), dtype=x.dtype, device=x.device)
    rstd = torch.empty((R,), dtype=torch.float32, device=x.device)
    block_r, block_h, num_warps = _tile(H)
    if R:
        _add_rmsnorm_fwd_kernel[(triton.cdiv(R, block_r),)](
            x2, r2, w, y, s, rstd, R, H, x2.stride(0), r2.stride(0), float(eps),
            BLOCK_R=block_r, BLOCK_H=block_h, num_warps=num_warps, **pdl_launch(CONFIG["PDL"], x.device),
        )
    return y, s, rstd


def add_rmsnorm_bwd(g: torch.Tensor, gs: torch.Tensor | None, s: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor):
    R, H = s.shape
    g2 = g.reshape(R, H).contiguous()
    gs2 = gs.reshape(R, H).contiguous() if gs is not None else g2
    ds = torch.empty((R, H), dtype=s.dtype, device=s.device)
    block_r, block_h, num_warps = _tile(H)
    bwd_rows = max(CONFIG["BWD_ROWS"], block_r)
    n_prog = triton.cdiv(R, bwd_rows)
    part = torch.empty((n_prog, H), dtype=torch.float32, device=s.device)
    if R:
        _add_rmsnorm_bwd_kernel[(n_prog,)](
            s, w, g2, gs2, rstd, ds, part, R, H,
            BLOCK_R=block_r, BLOCK_H=block_h, BWD_ROWS=bwd_rows, HAS_GS=gs is not None, num_warps=num_warps,
        )
    dw = part.sum(dim=0) if R else torch.zeros((H,), dtype=torch.float32, device=s.device)
    return ds, dw.to(w.dtype)


class AddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
        y, s, rstd = add_rmsnorm_fwd(x, residual, w, eps)
        ctx.save_for_backward(s, w, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape), s.view(x.shape)

    @staticmethod
    def backward(ctx, g_out: torch.Tensor, g_residual: torch.Tensor | None):
        s, w, rstd = ctx.saved_tensors
        if g_out is None:
            g_out = torch.zeros(s.shape, dtype=s.dtype, device=s.device)
        ds, dw = add_rmsnorm_bwd(g_out, g_residual, s, w, rstd)
        ds = ds.view(ctx.x_shape)
        return ds, ds, dw, None


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual, w, eps), x + residual), both in x's dtype; x, residual [..., H], w [H]."""
    return AddRMSNormFunction.apply(x, residual, w, eps)
