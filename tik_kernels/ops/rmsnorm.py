"""RMSNorm over the last dimension, batch-invariant: `rmsnorm(x[..., H], w[H], eps) -> y[..., H]`.

Also the per-head q/k norm of Qwen3: `rmsnorm(q[T, Hh, D], w[D], eps)` normalizes every head's
D-vector with the same w[D]; any leading dims are flattened into rows (there is no separate
`qk_norm` entry point).

Invariance: a row's result depends only on that row. Rows are laid out in a tile of
[BLOCK_R, BLOCK_H]; BLOCK_H = next_pow2(H) covers the whole row, BLOCK_R and num_warps are
functions of H (the problem width) only, never of the number of rows, so the sum of squares of
a row is one `tl.sum` over axis 1 with the same reduction tree whatever T is, which tile the row
lands in, or its slot in the tile. Masked lanes contribute exact zeros.

Cast order follows the Hugging Face Llama/Qwen3 RMSNorm (and PRIOR_ART.md): fp32 x·rsqrt(mean
x² + eps), rounded to the input dtype, *then* multiplied by w in fp32 and rounded again — so a
model using this kernel keeps its reference numerics.

Backward: dx is per row (invariant too). dw = Σ_rows g·x̂ is reduced deterministically: each
program sums a fixed block of BWD_ROWS rows in order into a fp32 partial, and the partials
[P, H] are summed by `torch.sum(dim=0)` (fixed tree for a fixed shape, no atomics). dw is
deterministic on rerun, not batch-invariant (it is a sum over the batch).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tik_kernels.ops._common import pdl_launch, pdl_start, round_to
from tik_kernels.ops.rope import _cos_sin, _rotate

TUNABLES = {
    "TILE_ELEMS": (1024, 2048, 4096, 8192),
    "MAX_WARPS": (1, 2, 4, 8, 16),
    "BWD_ROWS": (32, 64, 128, 256),
    "PDL": (0, 1),
    "ROPE_REGS": (0, 1),
}
#: PDL: the forward launched with programmatic dependent launch (ops/_common.py), no bit changes
#: ROPE_REGS (`rmsnorm_pair_rope_cache` only, a power-of-two head width): the rope takes the two halves of each normed
#: row from registers (the rounded values, split in place) instead of storing the rows and reading them back after a
#: barrier; the same values, so no bit changes, and nothing but the rope's outputs written. Off: timed on an H100 it
#: gained nothing (the qwen3-0.6b decode step 1.931 / 2.233 ms against 1.896 / 2.334 at context 128 / 256, one run;
#: benchmarks/results/e2e_h100_decode_qk_regs_s26.json)
#: BWD_ROWS 32 (was 128): more programs for a trainer's minibatch of rows, as add_rmsnorm's (new dw bits,
#: deterministic; results/train_profile_h100_qwen3-0.6b_s31_variants.md)
CONFIG = {"TILE_ELEMS": 4096, "MAX_WARPS": 8, "BWD_ROWS": 32, "PDL": 1, "ROPE_REGS": 0}


@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr,  # [R, H] input rows, unit column stride; row r at (r // n_inner) * stride_x + (r % n_inner) * stride_in
    w_ptr,  # [H] weight
    y_ptr,  # [R, H] output, contiguous
    rstd_ptr,  # [R] fp32 1/rms per row, saved for backward
    R,
    H,
    stride_x,
    n_inner,
    stride_in,
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    w2_ptr=None,  # PAIR: the weight of the rows whose inner index is n_first or more
    n_first=0,
    PAIR: tl.constexpr = False,
    PDL: tl.constexpr = False,
    # ROPE (with PAIR; `rmsnorm_pair_rope_cache`): then the rows rotated as tik_kernels/ops/rope.py rotates them,
    # q rows (inner index < n_first) into qo, k rows into ko and the key cache, and each k row's v row into the value
    # cache, at [slot[t], head, pos[t]]
    pos_ptr=None,  # [T] integer positions
    qo_ptr=None,  # [T, n_first, H] output q, contiguous
    ko_ptr=None,  # [T, n_inner - n_first, H] output k, contiguous
    v_ptr=None,  # [T, n_inner - n_first, H] values (strides stride_vt, stride_vh; unit stride over H)
    slot_ptr=None,  # [T] each token's cache slot
    kc_ptr=None,  # key cache (strides stride_cs, stride_ch, stride_cp; unit stride over H)
    vc_ptr=None,  # value cache, the key cache's strides
    log2_theta=0.0,
    stride_vt=0,
    stride_vh=0,
    stride_cs=0,
    stride_ch=0,
    stride_cp=0,
    ROPE: tl.constexpr = False,
    HALF: tl.constexpr = 1,  # H // 2
    BLOCK_HALF: tl.constexpr = 1,
    ROPE_REGS: tl.constexpr = False,  # (with ROPE, BLOCK_H == H) the halves from registers, nothing else stored
):
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    o_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    o_h = tl.arange(0, BLOCK_H)
    m_r = o_r < R
    m_h = o_h < H
    m = m_r[:, None] & m_h[None, :]
    row = (o_r // n_inner) * stride_x + (o_r % n_inner) * stride_in
    b_x = tl.load(x_ptr + row[:, None] + o_h[None, :], mask=m, other=0.0).to(tl.float32)  # [BR, BH]
    b_w = tl.load(w_ptr + o_h, mask=m_h, other=0.0).to(tl.float32)  # [BH]
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) / H + eps)  # [BR]
    # HF cast order: normalize in fp32, round to the activation dtype, then scale by w
    b_xn = round_to(b_x * b_rstd[:, None], y_ptr.dtype.element_ty).to(tl.float32)
    if PAIR:
        b_w2 = tl.load(w2_ptr + o_h, mask=m_h, other=0.0).to(tl.float32)
        b_y = b_xn * tl.where(((o_r % n_inner) < n_first)[:, None], b_w[None, :], b_w2[None, :])
    else:
        b_y = b_xn * b_w[None, :]
    if ROPE and ROPE_REGS:
        # the rounded normed rows, each split into its two halves in registers: the values storing the rows and
        # reading them back would give (BLOCK_H == H: the halves are the tile's two column halves)
        b_yr = round_to(b_y, y_ptr.dtype.element_ty).to(tl.float32)
        b_x1, b_x2 = tl.split(tl.permute(tl.reshape(b_yr, [BLOCK_R, 2, BLOCK_HALF]), (0, 2, 1)))
    else:
        tl.store(y_ptr + o_r[:, None] * H + o_h[None, :], round_to(b_y, y_ptr.dtype.element_ty), mask=m)
        tl.store(rstd_ptr + o_r, b_rstd, mask=m_r)
        if ROPE:
            tl.debug_barrier()  # the rows just stored (the normed values, rounded) visible to every thread
            o_i = tl.arange(0, BLOCK_HALF)
            m_y = m_r[:, None] & (o_i < HALF)[None, :]
            o_y = o_r[:, None] * H + o_i[None, :]
            b_x1 = tl.load(y_ptr + o_y, mask=m_y, other=0.0).to(tl.float32)
            b_x2 = tl.load(y_ptr + o_y + HALF, mask=m_y, other=0.0).to(tl.float32)
    if ROPE:
        _rope_rows(b_x1, b_x2, o_r, m_r, n_inner, n_first, H, pos_ptr, qo_ptr, ko_ptr, v_ptr, slot_ptr, kc_ptr,
                   vc_ptr, log2_theta, stride_vt, stride_vh, stride_cs, stride_ch, stride_cp, HALF, BLOCK_H, BLOCK_HALF)


@triton.jit
def _rope_rows(b_x1, b_x2, o_r, m_r, n_inner, n_first, H, pos_ptr, qo_ptr, ko_ptr, v_ptr, slot_ptr, kc_ptr, vc_ptr,
               log2_theta, stride_vt, stride_vh, stride_cs, stride_ch, stride_cp, HALF: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rows of the normed [T, n_inner, H] output, given as their halves `b_x1`, `b_x2` ([BLOCK_R, BLOCK_HALF] fp32 of
    the rounded values; row r: token r // n_inner, head r % n_inner), rotated by their token's position, written out
    and into the caches (`rmsnorm_pair_rope_cache`), through rope's own helpers (`tik_kernels/ops/rope.py`:
    `_cos_sin`, `_rotate`), then one rounding, as `_rope_kernel` does; the tests compare the bits with rope's on the
    GPU."""
    o_i = tl.arange(0, BLOCK_HALF)
    m_i = o_i < HALF
    t = o_r // n_inner
    h = o_r % n_inner
    is_q = h < n_first
    hk = tl.where(is_q, 0, h - n_first)
    b_ipos = tl.load(pos_ptr + t, mask=m_r, other=0)
    b_pos = b_ipos.to(tl.float32)  # [BR]
    # rope's own angle step and rotation (their multiply-adds written out there: left to LLVM, a copy of
    # `x2 * c + x1 * s` here once fused the other product, and the GPU's bits differed from rope's: session 26)
    b_c, b_s = _cos_sin(b_pos, o_i, log2_theta, HALF, 1)  # [BR, BHALF]
    m = m_r[:, None] & m_i[None, :]
    b_y1, b_y2 = _rotate(b_x1, b_x2, b_c, b_s)
    b_y1 = round_to(b_y1, qo_ptr.dtype.element_ty)
    b_y2 = round_to(b_y2, qo_ptr.dtype.element_ty)
    n_k = n_inner - n_first
    m_q = m & is_q[:, None]
    o_q = (t * n_first + h)[:, None] * H + o_i[None, :]
    tl.store(qo_ptr + o_q, b_y1, mask=m_q)
    tl.store(qo_ptr + o_q + HALF, b_y2, mask=m_q)
    m_k = m & (~is_q)[:, None]
    o_k = (t * n_k + hk)[:, None] * H + o_i[None, :]
    tl.store(ko_ptr + o_k, b_y1, mask=m_k)
    tl.store(ko_ptr + o_k + HALF, b_y2, mask=m_k)
    # the cache rows: the same rounded values at (slot, head, position), and the value row beside them
    b_slot = tl.load(slot_ptr + t, mask=m_r, other=0).to(tl.int64)
    o_c = b_slot * stride_cs + hk.to(tl.int64) * stride_ch + b_ipos.to(tl.int64) * stride_cp  # [BR]
    tl.store(kc_ptr + o_c[:, None] + o_i[None, :], b_y1, mask=m_k)
    tl.store(kc_ptr + o_c[:, None] + o_i[None, :] + HALF, b_y2, mask=m_k)
    o_d = tl.arange(0, BLOCK_H)
    m_v = (m_r & ~is_q)[:, None] & (o_d < H)[None, :]
    b_v = tl.load(v_ptr + (t * stride_vt + hk * stride_vh)[:, None] + o_d[None, :], mask=m_v)
    tl.store(vc_ptr + o_c[:, None] + o_d[None, :], b_v, mask=m_v)


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr,  # [R, H] forward input (rows addressed as in the forward)
    w_ptr,  # [H] weight
    g_ptr,  # [R, H] upstream gradient, contiguous
    rstd_ptr,  # [R] fp32 saved 1/rms
    dx_ptr,  # [R, H] input gradient, contiguous
    dw_part_ptr,  # [P, H] fp32 per-program partial weight gradients
    R,
    H,
    stride_x,
    n_inner,
    stride_in,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BWD_ROWS: tl.constexpr,
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
        row = (o_r // n_inner) * stride_x + (o_r % n_inner) * stride_in
        b_x = tl.load(x_ptr + row[:, None] + o_h[None, :], mask=m, other=0.0).to(tl.float32)
        b_g = tl.load(g_ptr + o_r[:, None] * H + o_h[None, :], mask=m, other=0.0).to(tl.float32)
        b_rstd = tl.load(rstd_ptr + o_r, mask=m_r, other=0.0)
        b_xhat = b_x * b_rstd[:, None]  # [BR, BH]
        b_gw = b_g * b_w[None, :]
        b_c = tl.sum(b_gw * b_xhat, axis=1) / H  # [BR]
        b_dx = (b_gw - b_xhat * b_c[:, None]) * b_rstd[:, None]
        tl.store(dx_ptr + o_r[:, None] * H + o_h[None, :], round_to(b_dx, dx_ptr.dtype.element_ty), mask=m)
        b_dw += tl.sum(b_g * b_xhat, axis=0)
    tl.store(dw_part_ptr + pid * H + o_h, b_dw, mask=m_h)


def _tile(H: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_H, num_warps) from the row width only."""
    block_h = triton.next_power_of_2(H)
    if block_h > 65536:
        raise ValueError(f"rmsnorm: row width {H} exceeds the single-block limit 65536")
    block_r = max(1, CONFIG["TILE_ELEMS"] // block_h)
    num_warps = max(1, min(CONFIG["MAX_WARPS"], block_r * block_h // 512))
    return block_r, block_h, num_warps


def _rows(x: torch.Tensor, H: int) -> tuple[torch.Tensor, int, tuple[int, int, int]]:
    """x's rows without a copy where the kernel can address them: (tensor, rows, (stride_x, n_inner, stride_in)).

    A [T, Hh, D] slice of a wider buffer (q or k heads of a stacked qkv projection's output) has no single row
    stride, but its row r = (t, h) sits at t * stride(0) + h * stride(1): two strides, no copy."""
    if x.dim() == 3 and x.stride(-1) == 1 and x.shape[1] and x.stride(0) != x.shape[1] * x.stride(1):
        return x, x.shape[0] * x.shape[1], (x.stride(0), x.shape[1], x.stride(1))
    x2 = x.reshape(-1, H)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    return x2, x2.shape[0], (x2.stride(0), 1, 0)


def rmsnorm_fwd(x: torch.Tensor, w: torch.Tensor, eps: float, w2: torch.Tensor | None = None,
                n_first: int = 0, rope: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`w2` (`rmsnorm_pair`): the weight of x[..., h, :] for h >= n_first of a [T, Hh, H] x; w that of the others.
    `rope` (with `w2`; `rmsnorm_pair_rope_cache`): the kernel's ROPE arguments, the rotation after the norm."""
    H = x.shape[-1]
    if w.shape != (H,):
        raise ValueError(f"rmsnorm: weight shape {tuple(w.shape)} != ({H},)")
    x2, R, addr = _rows(x, H)
    y = torch.empty((R, H), dtype=x.dtype, device=x.device)
    rstd = torch.empty((R,), dtype=torch.float32, device=x.device)
    block_r, block_h, num_warps = _tile(H)
    if R:
        _rmsnorm_fwd_kernel[(triton.cdiv(R, block_r),)](
            x2, w, y, rstd, R, H, *addr, float(eps), BLOCK_R=block_r, BLOCK_H=block_h, num_warps=num_warps,
            **({} if w2 is None else dict(w2_ptr=w2, n_first=n_first, PAIR=True)), **(rope or {}),
            **pdl_launch(CONFIG.get("PDL"), x.device),
        )
    return y.view(x.shape), x2, rstd, addr


def rmsnorm_bwd(
    g: torch.Tensor, x2: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, addr: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    R, H = rstd.shape[0], x2.shape[-1]
    g2 = g.reshape(R, H).contiguous()
    dx = torch.empty((R, H), dtype=x2.dtype, device=x2.device)
    block_r, block_h, num_warps = _tile(H)
    bwd_rows = max(CONFIG["BWD_ROWS"], block_r)
    n_prog = triton.cdiv(R, bwd_rows)
    part = torch.empty((n_prog, H), dtype=torch.float32, device=x2.device)
    if R:
        _rmsnorm_bwd_kernel[(n_prog,)](
            x2, w, g2, rstd, dx, part, R, H, *addr,
            BLOCK_R=block_r, BLOCK_H=block_h, BWD_ROWS=bwd_rows, num_warps=num_warps,
        )
    dw = part.sum(dim=0) if R else torch.zeros((H,), dtype=torch.float32, device=x2.device)
    return dx, dw.to(w.dtype)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        y, x2, rstd, addr = rmsnorm_fwd(x, w, eps)
        ctx.save_for_backward(x2, w, rstd)
        ctx.x_shape, ctx.addr = x.shape, addr
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x2, w, rstd = ctx.saved_tensors
        dx, dw = rmsnorm_bwd(g, x2, w, rstd, ctx.addr)
        return dx.view(ctx.x_shape), dw, None


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of x over its last dim with weight w: x[T, H] (hidden) or x[T, Hh, D] (per-head q/k norm)."""
    return RMSNormFunction.apply(x, w, eps)


def _follows(q: torch.Tensor, k: torch.Tensor) -> bool:
    """k's heads start where q's end, row for row (q and k of one stacked qkv projection's output)."""
    return (q.dim() == k.dim() == 3 and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2] and q.dtype == k.dtype
            and (q.stride(0) == k.stride(0) or q.shape[0] == 1) and q.stride(1) == k.stride(1) == q.shape[2]
            and q.stride(2) == k.stride(2) == 1
            and k.data_ptr() == q.data_ptr() + q.shape[1] * q.stride(1) * q.element_size())


@torch.no_grad()
def rmsnorm_pair(q: torch.Tensor, wq: torch.Tensor, k: torch.Tensor, wk: torch.Tensor,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rmsnorm(q, wq, eps), rmsnorm(k, wk, eps))` bit for bit, in one launch where k's heads follow q's in memory
    (Qwen3's q and k norms over one qkv projection's output: a decode step's two smallest launches), else two.
    Every row goes through the same kernel, tile and warps as `rmsnorm`'s (they follow the width only), so its sum of
    squares has the same tree; only which weight multiplies it is chosen per row. Not differentiable: the rollout's
    forward; the trainer calls rmsnorm twice."""
    H = q.shape[-1]
    if wq.shape != (H,) or wk.shape != (k.shape[-1],):
        raise ValueError(f"rmsnorm_pair: weights {tuple(wq.shape)} / {tuple(wk.shape)} do not match q / k")
    if not _follows(q, k) or not q.shape[0] or wq.dtype != wk.dtype:
        return rmsnorm(q, wq, eps), rmsnorm(k, wk, eps)
    hq = q.shape[1]
    # q's and k's heads as one [T, Hq + Hk, H] view of the storage they share
    qk = q.as_strided((q.shape[0], hq + k.shape[1], H), (q.stride(0), q.stride(1), 1))
    y = rmsnorm_fwd(qk, wq, eps, w2=wk, n_first=hq)[0]
    return y[:, :hq], y[:, hq:]


@torch.no_grad()
def rmsnorm_pair_rope_cache(q: torch.Tensor, wq: torch.Tensor, k: torch.Tensor, wk: torch.Tensor, eps: float,
                            v: torch.Tensor, pos: torch.Tensor, theta: float, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`rope.rope_cache(*rmsnorm_pair(q, wq, k, wk, eps), v, pos, theta, k_cache, v_cache, slots)` bit for bit, the
    rope being the library's (tik_kernels/ops/rope.py), in one launch: the rollout's q / k norms, rope and KV-cache
    fill, two launches a layer before. Each program normalizes its rows as `rmsnorm_pair` does (the same kernel, tile
    and warps), stores them, and then rotates the rows it stored with rope's arithmetic, written again here
    (`_rope_rows`). None where it does not apply (k's heads not right after q's in one buffer, a width rope cannot
    take, caches that do not match): the caller makes the two calls. Not differentiable: the rollout's forward."""
    H = q.shape[-1]
    if (wq.shape != (H,) or wk.shape != (k.shape[-1],) or not _follows(q, k) or not q.shape[0] or H % 2
            or wq.dtype != wk.dtype or v.dim() != 3 or v.shape != k.shape or v.stride(-1) != 1
            or k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride()
            or k_cache.shape[1] != k.shape[1] or k_cache.shape[3] != H or k_cache.stride(3) != 1
            or k_cache.dtype != k.dtype or v_cache.dtype != v.dtype or pos.shape != (q.shape[0],)
            or slots.shape != (q.shape[0],)):
        return None
    T, hq, hk = q.shape[0], q.shape[1], k.shape[1]
    qk = q.as_strided((T, hq + hk, H), (q.stride(0), q.stride(1), 1))
    qo = torch.empty((T, hq, H), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, hk, H), dtype=k.dtype, device=k.device)
    rmsnorm_fwd(qk, wq, eps, w2=wk, n_first=hq, rope=dict(
        pos_ptr=pos.contiguous(), qo_ptr=qo, ko_ptr=ko, v_ptr=v, slot_ptr=slots.contiguous(), kc_ptr=k_cache,
        vc_ptr=v_cache, log2_theta=math.log2(theta), stride_vt=v.stride(0), stride_vh=v.stride(1),
        stride_cs=k_cache.stride(0), stride_ch=k_cache.stride(1), stride_cp=k_cache.stride(2), ROPE=True, HALF=H // 2,
        BLOCK_HALF=triton.next_power_of_2(H // 2), ROPE_REGS=bool(CONFIG.get("ROPE_REGS")) and _tile(H)[1] == H))
    return qo, ko
