"""Rotary position embedding, batch-invariant: `rope(q[T, Hq, D], k[T, Hk, D], pos[T], theta) -> (q, k)`.

Convention (Llama / Qwen3, "neox" half rotation): for i < D/2 the pair (x[i], x[i + D/2]) is rotated by
angle pos · θ^(-2i/D): out[i] = x[i]·cos − x[i+D/2]·sin, out[i+D/2] = x[i+D/2]·cos + x[i]·sin.
New tensors are returned (inputs are never written); q and k may be strided views of a fused qkv output
as long as their last dim is contiguous.

Invariance: a token's result depends only on its own q, k and pos. cos and sin are computed in-kernel in
fp32 from pos and θ alone — inv_freq = exp2(−(2i/D)·log2 θ) with log2 θ taken in float64 on the host,
angle = fp32(pos)·inv_freq, then a two-constant Cody–Waite reduction to [−π, π] so `tl.cos`/`tl.sin`
are accurate whether or not they lower to approximate instructions — and the rotation is elementwise,
rounded once to the output dtype. No cos/sin cache whose layout or length could follow the batch.

Backward is the inverse rotation (angle −θ) of the output gradients, by the same kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import sm_count
from tik_kernels.ops._common import pdl_launch, pdl_start, round_to

#: elementwise: any BLOCK_T (tokens per program) gives the same bits
#: FILL 1: BLOCK_T halves (down to 1) while the launch would have fewer programs than the GPU has SMs, so a decode
#: step's few tokens still spread over the GPU (H200, qwen3-0.6b decode at 64 tokens: 8 programs took 5.2 us)
#: PDL: the kernel launched with programmatic dependent launch (ops/_common.py), no bit changes
TUNABLES = {"BLOCK_T": (1, 2, 4, 8, 16), "num_warps": (1, 2, 4, 8), "FILL": (0, 1), "PDL": (0, 1)}
CONFIG = {"BLOCK_T": 8, "num_warps": 4, "FILL": 1, "PDL": 1}


def _block_t(T: int, device: torch.device) -> int:
    """Tokens per program: CONFIG's, halved while FILL is on and the grid would leave SMs without a program."""
    bt = CONFIG["BLOCK_T"]
    if CONFIG.get("FILL"):
        sms = sm_count(device)
        while bt > 1 and triton.cdiv(T, bt) < sms:
            bt //= 2
    return bt


@triton.jit
def _cos_sin(b_pos, o_i, log2_theta, HALF: tl.constexpr, SIGN: tl.constexpr):
    """cos and SIGN * sin of position b_pos[t] times frequency o_i ([len(b_pos), len(o_i)] fp32): the angle reduced to
    [-pi, pi] first, k * 6.28125 being exact (6.28125 has 8 significant bits) and the rest of 2 pi taken after it. Its
    multiply-adds are written out, as the compiler contracted them, so that every kernel calling it (rmsnorm's
    `_rope_rows` too) fuses the same products whatever the code around the call."""
    b_inv = tl.exp2(-(o_i.to(tl.float32) * 2.0 / (2 * HALF)) * log2_theta)  # [BHALF]
    b_ang = b_pos[:, None] * b_inv[None, :]
    b_k = tl.floor(tl.fma(b_ang, 0.15915494309189535, 0.5))
    b_r = tl.fma(b_k, -0.0019353071795864769, tl.fma(b_k, -6.28125, b_ang))
    return tl.cos(b_r), tl.sin(b_r) * SIGN


@triton.jit
def _rotate(b_x1, b_x2, b_c, b_s):
    """(x1 cos - x2 sin, x2 cos + x1 sin), each one fused multiply-add of a rounded product: fma(x1, cos, -(x2 sin))
    and fma(x1, sin, x2 cos). Written out because LLVM chooses which product of `a * b + c * d` it fuses from the
    code around it: the same expression in another kernel fused the other product, and its bits differed on the GPU
    (session 26)."""
    # the negation a multiplication by -1 (exact; `-x` is `0 - x` to Triton, which turns -0 into +0 and may fuse)
    return tl.fma(b_x1, b_c, (b_x2 * b_s) * -1.0), tl.fma(b_x1, b_s, b_x2 * b_c)


@triton.jit
def _rotate_heads(
    x_ptr, y_ptr, o_t, m_t, stride_t, stride_h, NH, b_cos, b_sin,
    HALF: tl.constexpr, BLOCK_NH: tl.constexpr, BLOCK_HALF: tl.constexpr,
    c_ptr=None, o_c=None, stride_ch=0, CACHE: tl.constexpr = False,
):
    o_h = tl.arange(0, BLOCK_NH)
    o_i = tl.arange(0, BLOCK_HALF)
    m = m_t[:, None, None] & (o_h < NH)[None, :, None] & (o_i < HALF)[None, None, :]
    o_x = o_t[:, None, None] * stride_t + o_h[None, :, None] * stride_h + o_i[None, None, :]  # [BT, BNH, BHALF]
    b_x1 = tl.load(x_ptr + o_x, mask=m, other=0.0).to(tl.float32)
    b_x2 = tl.load(x_ptr + o_x + HALF, mask=m, other=0.0).to(tl.float32)
    b_c, b_s = b_cos[:, None, :], b_sin[:, None, :]
    b_y1, b_y2 = _rotate(b_x1, b_x2, b_c, b_s)
    o_y = o_t[:, None, None] * (NH * 2 * HALF) + o_h[None, :, None] * (2 * HALF) + o_i[None, None, :]
    b_y1 = round_to(b_y1, y_ptr.dtype.element_ty)
    b_y2 = round_to(b_y2, y_ptr.dtype.element_ty)
    tl.store(y_ptr + o_y, b_y1, mask=m)
    tl.store(y_ptr + o_y + HALF, b_y2, mask=m)
    if CACHE:
        # the same rounded values again, at each token's cache row (o_c: its slot and position offset)
        o_cy = o_c[:, None, None] + o_h[None, :, None] * stride_ch + o_i[None, None, :]
        tl.store(c_ptr + o_cy, b_y1, mask=m)
        tl.store(c_ptr + o_cy + HALF, b_y2, mask=m)


@triton.jit
def _copy_heads(x_ptr, c_ptr, o_t, m_t, o_c, stride_t, stride_h, stride_ch, NH,
                D: tl.constexpr, BLOCK_NH: tl.constexpr, BLOCK_D: tl.constexpr):
    """x[t, h, :] -> the cache row at o_c[t] + h * stride_ch: values unchanged."""
    o_h = tl.arange(0, BLOCK_NH)
    o_d = tl.arange(0, BLOCK_D)
    m = m_t[:, None, None] & (o_h < NH)[None, :, None] & (o_d < D)[None, None, :]
    b_x = tl.load(x_ptr + o_t[:, None, None] * stride_t + o_h[None, :, None] * stride_h + o_d[None, None, :], mask=m)
    tl.store(c_ptr + o_c[:, None, None] + o_h[None, :, None] * stride_ch + o_d[None, None, :], b_x, mask=m)


@triton.jit
def _rope_kernel(
    q_ptr,  # [T, Hq, D] input q (strides stride_qt, stride_qh; unit stride over D)
    k_ptr,  # [T, Hk, D] input k (strides stride_kt, stride_kh)
    pos_ptr,  # [T] integer positions
    qo_ptr,  # [T, Hq, D] output q, contiguous
    ko_ptr,  # [T, Hk, D] output k, contiguous
    T,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    HQ,
    HK,
    log2_theta,
    SIGN: tl.constexpr,  # +1 forward, -1 backward (inverse rotation)
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    # CACHE: also write k's rotated rows and v's rows into [slots, Hk, len, D] caches at (slot[t], :, pos[t])
    v_ptr=None,  # [T, Hk, D] values (strides stride_vt, stride_vh; unit stride over D)
    slot_ptr=None,  # [T] each token's cache slot
    kc_ptr=None,  # key cache (strides stride_cs, stride_ch, stride_cp; unit stride over D)
    vc_ptr=None,  # value cache, the key cache's strides
    stride_vt=0,
    stride_vh=0,
    stride_cs=0,
    stride_ch=0,
    stride_cp=0,
    CACHE: tl.constexpr = False,
    BLOCK_D: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    o_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < T
    o_i = tl.arange(0, BLOCK_HALF)
    b_ipos = tl.load(pos_ptr + o_t, mask=m_t, other=0)
    b_pos = b_ipos.to(tl.float32)  # [BT]
    b_cos, b_sin = _cos_sin(b_pos, o_i, log2_theta, HALF, SIGN)  # [BT, BHALF]
    _rotate_heads(q_ptr, qo_ptr, o_t, m_t, stride_qt, stride_qh, HQ, b_cos, b_sin, HALF, BLOCK_HQ, BLOCK_HALF)
    o_c = o_t  # CACHE: each token's cache row offset (its slot and position)
    if CACHE:
        b_slot = tl.load(slot_ptr + o_t, mask=m_t, other=0).to(tl.int64)
        o_c = b_slot * stride_cs + b_ipos.to(tl.int64) * stride_cp  # [BT]
    _rotate_heads(k_ptr, ko_ptr, o_t, m_t, stride_kt, stride_kh, HK, b_cos, b_sin, HALF, BLOCK_HK, BLOCK_HALF,
                  kc_ptr, o_c, stride_ch, CACHE)
    if CACHE:
        _copy_heads(v_ptr, vc_ptr, o_t, m_t, o_c, stride_vt, stride_vh, stride_ch, HK, 2 * HALF, BLOCK_HK, BLOCK_D)


def _heads(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 3:
        raise ValueError(f"rope: expected [T, heads, D], got shape {tuple(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()


def rope_apply(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, theta: float, sign: int, cache=None):
    """`cache`: (v, k_cache, v_cache, slots), see `rope_cache`."""
    q, k = _heads(q), _heads(k)
    T, HQ, D = q.shape
    if k.shape[0] != T or k.shape[2] != D or pos.shape != (T,) or D % 2:
        raise ValueError(f"rope: q {tuple(q.shape)}, k {tuple(k.shape)}, pos {tuple(pos.shape)} do not agree")
    HK = k.shape[1]
    qo = torch.empty((T, HQ, D), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, HK, D), dtype=k.dtype, device=k.device)
    extra = {}
    if cache is not None:
        v, kc, vc, slots = cache
        v = _heads(v)
        if (v.shape != k.shape or kc.dim() != 4 or kc.shape != vc.shape or kc.stride() != vc.stride()
                or kc.shape[1] != HK or kc.shape[3] != D or kc.stride(3) != 1 or slots.shape != (T,)
                or kc.dtype != k.dtype or vc.dtype != v.dtype):
            raise ValueError(f"rope_cache: v {tuple(v.shape)}, caches {tuple(kc.shape)} / {tuple(vc.shape)}, "
                             f"slots {tuple(slots.shape)} do not agree with k {tuple(k.shape)}")
        extra = dict(v_ptr=v, slot_ptr=slots.contiguous(), kc_ptr=kc, vc_ptr=vc, stride_vt=v.stride(0),
                     stride_vh=v.stride(1), stride_cs=kc.stride(0), stride_ch=kc.stride(1), stride_cp=kc.stride(2),
                     CACHE=True, BLOCK_D=triton.next_power_of_2(D))
    if T:
        bt = _block_t(T, q.device)
        _rope_kernel[(triton.cdiv(T, bt),)](
            q, k, pos.contiguous(), qo, ko, T, q.stride(0), q.stride(1), k.stride(0), k.stride(1), HQ, HK,
            math.log2(theta), SIGN=sign, HALF=D // 2, BLOCK_T=bt, BLOCK_HQ=triton.next_power_of_2(HQ),
            BLOCK_HK=triton.next_power_of_2(HK), BLOCK_HALF=triton.next_power_of_2(D // 2),
            num_warps=CONFIG["num_warps"], **extra, **pdl_launch(CONFIG.get("PDL"), q.device),
        )
    return qo, ko


class RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, theta: float):
        ctx.save_for_backward(pos)
        ctx.theta, ctx.q_shape, ctx.k_shape = theta, q.shape, k.shape
        return rope_apply(q, k, pos, theta, 1)

    @staticmethod
    def backward(ctx, gq: torch.Tensor | None, gk: torch.Tensor | None):
        (pos,) = ctx.saved_tensors
        # an output left out of the loss has no gradient: rotate zeros for it
        if gq is None:
            gq = torch.zeros(ctx.q_shape, dtype=gk.dtype, device=gk.device)
        if gk is None:
            gk = torch.zeros(ctx.k_shape, dtype=gq.dtype, device=gq.device)
        dq, dk = rope_apply(gq, gk, pos, ctx.theta, -1)
        return dq, dk, None, None


def rope(
    q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, theta: float = 1e6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q[T, Hq, D] and k[T, Hk, D] by their token's position pos[T] (neox half rotation, base theta)."""
    return RopeFunction.apply(q, k, pos, theta)


def rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, theta: float,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope(q, k, pos, theta)`, and in the same launch token t's rotated k and its v written into the caches
    `[slots, Hk, len, D]` at `[slots[t], :, pos[t]]`: the rollout's KV-cache fill, without the two scatters per
    layer a decode step would launch after the rope. The cache gets the returned k's values, bit for bit; no
    gradient flows through the caches (the rollout runs without one)."""
    return rope_apply(q, k, pos, theta, 1, cache=(v, k_cache, v_cache, slots))
