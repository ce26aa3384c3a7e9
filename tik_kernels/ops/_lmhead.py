"""The lm_head pieces `logprob`, `sample` and `entropy` share: one definition each, so the three operators compute the
same fp32 logits by construction (a sampled token's logprob is the logit the sampler used), and their backwards the
same gradient kernels.

- `_logits_tile`: a [BLOCK_T, BLOCK_V] tile of hidden @ w.T / temperature in fp32, a K-sequential `tl.dot` over H,
  BLOCK_K at a time (`_logits_step` one step of it: sample_logprob's FLAT walk takes the steps itself);
- `_grad_hidden_kernel`: grad_hidden = dz @ w, V reduced in increasing order, no split;
- `_grad_weight_kernel`: grad_w += dz.T @ hidden over a chunk of tokens, reduced in token order, into an fp32 [V, H]
  buffer owned tile by tile (chunks launched in order: deterministic, no atomics);
- `grads`: both launched for one chunk of tokens, with the operator's CONFIG (its BWD_* tiles and launch choices).
Both grad kernels take dz rounded to the operands' dtype for their dots (to nearest even, `round_to`, on the GPU and
in the interpreter alike; the interpreter then runs the dots in fp32, exact for the rounded operands).

Frozen with the operators that import them: a candidate for one of them may define its own versions instead (the
contract judges the module it submits), but never changes these.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET
from tik_kernels.ops._common import round_to

#: Triton's interpreter computes tl.dot on bf16 wrongly and truncates fp32 -> bf16 casts: fp32 there
_INTERPRET = tl.constexpr(INTERPRET)


@triton.jit
def _logits_tile(h_ptr, w_ptr, o_t, m_t, o_v, m_v, H, stride_h, stride_w, temperature,
                 BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_T, BLOCK_V] fp32 logits / temperature: a K-sequential dot over H, BLOCK_K at a time."""
    acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        acc = _logits_step(h_ptr, w_ptr, o_t, m_t, o_v, m_v, k0, H, stride_h, stride_w, acc, BLOCK_K)
    return acc / temperature


@triton.jit
def _logits_step(h_ptr, w_ptr, o_t, m_t, o_v, m_v, k0, H, stride_h, stride_w, acc, BLOCK_K: tl.constexpr):
    """One K step of `_logits_tile`: acc + h[:, k0:k0+BK] @ w[v, k0:k0+BK].T (also sample_logprob's FLAT walk)."""
    o_k = k0 + tl.arange(0, BLOCK_K)
    m_k = o_k < H
    b_h = tl.load(h_ptr + o_t[:, None] * stride_h + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
    b_w = tl.load(w_ptr + o_v[None, :] * stride_w + o_k[:, None], mask=m_v[None, :] & m_k[:, None], other=0.0)
    if _INTERPRET:
        b_h = b_h.to(tl.float32)
        b_w = b_w.to(tl.float32)
    return tl.dot(b_h, b_w, acc)  # [BT, BK] @ [BK, BV]


@triton.jit
def _grad_hidden_kernel(
    dz_ptr,  # [n, V] fp32, or w's dtype (BWD_DZ_LOW)
    w_ptr,  # [V, H] lm_head weight (row stride stride_w)
    gh_ptr,  # [n, H] grad of hidden (row stride stride_gh)
    n,
    V,
    H,
    stride_w,
    stride_gh,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    o_t = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_h = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_t = o_t < n
    m_h = o_h < H
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # reduction over V in increasing order, no split: grad_hidden = dz @ w
    for v0 in range(0, V, BLOCK_K):
        o_v = (v0 + tl.arange(0, BLOCK_K)).to(tl.int64)  # v · stride reaches 6e8 at V = 151,936
        m_v = o_v < V
        b_dz = tl.load(dz_ptr + o_t[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_w = tl.load(w_ptr + o_v[:, None] * stride_w + o_h[None, :], mask=m_v[:, None] & m_h[None, :], other=0.0)
        if b_dz.dtype != b_w.dtype:  # the dot's operand (BWD_DZ_LOW: the scratch holds it already)
            b_dz = round_to(b_dz, b_w.dtype)
        if _INTERPRET:  # the interpreter's dot in fp32: exact for the rounded operands
            b_dz = b_dz.to(tl.float32)
            b_w = b_w.to(tl.float32)
        acc = tl.dot(b_dz, b_w, acc)  # [BM, BK] @ [BK, BN]
    tl.store(gh_ptr + o_t[:, None] * stride_gh + o_h[None, :], round_to(acc, gh_ptr.dtype.element_ty),
             mask=m_t[:, None] & m_h[None, :])


@triton.jit
def _grad_weight_kernel(
    dz_ptr,  # [n, V] fp32, or w's dtype (BWD_DZ_LOW)
    h_ptr,  # [n, H] hidden rows of this token chunk (row stride stride_h)
    gw_ptr,  # [V, H] fp32 accumulator of grad w, owned tile by tile
    n,
    V,
    H,
    stride_h,
    ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HFAST: tl.constexpr = False,
):
    # HFAST: the grid is (H tiles, V tiles), so the H tiles of one V tile run side by side and share its dz columns
    # through L2; who computes a tile, never its sum
    pid_m = tl.program_id(1 if HFAST else 0).to(tl.int64)
    pid_n = tl.program_id(0 if HFAST else 1).to(tl.int64)
    o_v = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_h = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_v = o_v < V
    m_h = o_h < H
    p_gw = gw_ptr + o_v[:, None] * H + o_h[None, :]
    m_gw = m_v[:, None] & m_h[None, :]
    if ACCUMULATE:
        acc = tl.load(p_gw, mask=m_gw, other=0.0)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # reduction over the chunk's tokens in increasing order; chunks are launched in order
    for t0 in range(0, n, BLOCK_K):
        o_t = (t0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        m_t = o_t < n
        b_dzt = tl.load(dz_ptr + o_t[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_t[None, :], other=0.0)
        b_h = tl.load(h_ptr + o_t[:, None] * stride_h + o_h[None, :], mask=m_t[:, None] & m_h[None, :], other=0.0)
        if b_dzt.dtype != b_h.dtype:  # the dot's operand, as in _grad_hidden_kernel
            b_dzt = round_to(b_dzt, b_h.dtype)
        if _INTERPRET:
            b_dzt = b_dzt.to(tl.float32)
            b_h = b_h.to(tl.float32)
        acc = tl.dot(b_dzt, b_h, acc)  # [BM, BK] @ [BK, BN]
    tl.store(p_gw, acc, mask=m_gw)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: rows whose last dimension is contiguous (a copy only where it is not)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def grads(cfg: dict, dz: torch.Tensor, w: torch.Tensor, h_c: torch.Tensor, first: bool, grad_h: torch.Tensor | None,
          gw_acc: torch.Tensor | None) -> None:
    """One chunk of tokens' share of the backward, from its dz scratch [n, V]: grad_h (the chunk's rows, where asked)
    = dz @ w, and gw_acc [V, H] fp32 (where asked) = dz.T @ h_c, added to the chunks before unless `first`. The tiles
    are cfg's BWD_BLOCK_M / N / K; BWD_GH_BLOCK_M (grad_h's rows a program), BWD_STAGES and BWD_GW_HFAST (grad_w's
    grid H-tiles first) only choose launches, where cfg has them."""
    n, (V, H) = h_c.shape[0], w.shape
    BM, BN, BK = cfg["BWD_BLOCK_M"], cfg["BWD_BLOCK_N"], cfg["BWD_BLOCK_K"]
    GM, stages = cfg.get("BWD_GH_BLOCK_M", BM), cfg.get("BWD_STAGES", cfg["num_stages"])
    hfast = int(cfg.get("BWD_GW_HFAST", 0))
    if grad_h is not None:
        _grad_hidden_kernel[(triton.cdiv(n, GM), triton.cdiv(H, BN))](
            dz, w, grad_h, n, V, H, w.stride(0), grad_h.stride(0),
            BLOCK_M=GM, BLOCK_N=BN, BLOCK_K=BK, num_warps=cfg["num_warps"], num_stages=stages,
        )
    if gw_acc is not None:
        grid = (triton.cdiv(V, BM), triton.cdiv(H, BN))
        _grad_weight_kernel[grid[::-1] if hfast else grid](
            dz, h_c, gw_acc, n, V, H, h_c.stride(0), ACCUMULATE=not first,
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, HFAST=hfast, num_warps=cfg["num_warps"], num_stages=stages,
        )
