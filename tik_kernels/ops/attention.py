"""Unified causal GQA attention: prefill, packed (varlen) training forward and KV-cache decode, bitwise equal.

How invariance is achieved. Every entry point reduces over keys the same way for a given query row:

* keys are walked in KV blocks of a fixed size `BLOCK_N` aligned to the absolute key position inside the
  sequence (block j holds keys j*BLOCK_N ... j*BLOCK_N + BLOCK_N - 1), always from block 0 upwards; there is
  no split-KV and the block size never depends on the regime, the batch, the length or the position;
* each block goes through one shared step, `_softmax_step`: raw fp32 scores s = q.k (one `tl.dot`, K = D),
  s * qk_scale, mask to -inf, running max (order-free), alpha = exp2(m_old - m_new), p = exp2(s - m_new)
  rounded to the input dtype, then `l = dot(p, ones, l * alpha)` and `acc = dot(p, v, acc * alpha)`;
* the only order-sensitive sums over keys are `tl.dot`s of the same K (= BLOCK_N), so no row reduction depends
  on the register layout of a kernel (a `tl.sum` would: its tree follows the layout, which follows the tile
  shape); the softmax denominator is therefore a dot with a ones matrix, not a `tl.sum`;
* blocks wholly in a row's future contribute exactly nothing (alpha == 1, p == 0), so a prefill tile may walk
  past a row's diagonal without changing that row's bits; masked keys get -inf scores and zero values, so
  garbage (even NaN) beyond a cache's length never leaks in;
* fp contraction is off for every launch (`enable_fp_fusion=False`), so `s * qk_scale - m` is never fused into
  an FMA in one kernel and not in another.

Prefill (`attention_prefill`, and `attention_varlen` for packed sequences) is one fused kernel: a program owns
BLOCK_M query rows of one KV-head group (rows enumerate (position, head-in-group) pairs, so the GQA heads that
share a KV head share its loads) and walks KV blocks 0 ... diagonal. Decode (`attention_decode`) has a single
query per sequence, so a fused kernel would leave most of the GPU idle; it runs in two phases instead, without
changing the order of anything: (1) raw scores for every KV block, in parallel over blocks (the same `tl.dot`
as prefill), written to an fp32 buffer; (2) parallel over head-dim slices of width DECODE_BLOCK_D, the same
`_softmax_step` recurrence replayed over blocks 0, 1, ... in order. Phase 2 recomputes l in every slice; the
bits per slice are those of the fused prefill because no sum spans two slices.

Phase 2 is a chain of L / BLOCK_N dependent steps, so at long contexts and small batches it is latency-bound:
on the H200 (CUDA graphs) B=1, L=16k took ~0.5 us per KV block of 64 whatever the head-dim split or the heads
per program (138 us against SDPA's 31, attention_h200_run4_bn64). What helped: taking memory round trips off the
chain, decode_num_stages 3 (0.76x the time of 2, attention_h200_run2) and `DECODE_PREFETCH = 1`, which issues
block j+1's score loads before block j's step (a further 0.89x, run4); and halving the chain with BLOCK_N = 128,
which also made prefill faster (decode 1.62x -> 1.37x SDPA's time, prefill 0.88x -> 0.85x, geomeans;
attention_h200.md, where the bitwise sweep of this root is green). `DECODE_PRECOMPUTE_P = 1` takes
everything but the accumulation out of that chain: the scores kernel also writes each block's row max; a
weights kernel, parallel over blocks, gets the running max entering block j as the max of the block maxima
before it (max is exact, so this is m_i of the recurrence, bit for bit), and writes alpha_j and the rounded
p_j with the step's own operations; phase 2 is then only `l = dot(p, ones, l * alpha)`,
`acc = dot(p, v, acc * alpha)` per block, in block order, on loads that no longer wait for the chain. The
same values go through the same dots in the same order, so the bits equal the default's (the CPU tests check
decode == prefill under both; the GPU benchmark's tunables section re-checks it on the device). On the H200 it
is bit-identical but not faster (its two extra launches cost more than the chain saves), so it is off.

What must never vary: BLOCK_N (frozen in the contract), the step's operation order, the use of exp2 with the
log2(e)-folded scale, the rounding of p to the input dtype before both dots, the fp32 accumulators. BLOCK_M,
warps, stages and the decode tiling change only which rows/columns share a program; on an H200 the MMA bits of
a row do not depend on them (see DESIGN.md), and the contract's root_bits check re-proves it per candidate.

KV cache: `k_cache[B, Hk, L, D]` with `lens[B]` valid keys per sequence (the current token's k/v already written
at `lens[b] - 1`); an engine allocates L once and writes position `lens[b]` in place, any strides allowed.
Backward (prefill and varlen): a dq kernel (one program per query tile, walking KV blocks) and a dk/dv kernel
(one program per KV block, walking every query row of the group); no atomics, so gradients are deterministic.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET

TUNABLES = {
    # the KV block: sets the order of the reduction over keys (frozen)
    "BLOCK_N": (128,),
    # the same on the CPU interpreter, smaller so that tiny test shapes span several blocks (frozen)
    "BLOCK_N_INTERPRET": (8,),
    "BLOCK_M": (64, 128),
    "num_warps": (4, 8),
    # 3 stages of 128 x 128 K and V tiles need more shared memory than an H200 has (233472 > 232448 bytes)
    "num_stages": (1, 2),
    "DECODE_BLOCK_M": (16, 64),
    "DECODE_BLOCK_D": (16, 32, 64, 128),
    "decode_num_warps": (2, 4, 8),
    "decode_num_stages": (1, 2, 3, 4),
    # warps of phase 2 alone (0: decode_num_warps)
    "decode2_num_warps": (0, 1, 2, 4, 8),
    # 1: decode precomputes every block's weights p and rescale factor alpha in parallel, so that the
    # sequential loop only rescales and accumulates (same values in the same order: the bits are equal)
    "DECODE_PRECOMPUTE_P": (0, 1),
    # 1: phase 2 gives each query head its own programs instead of one per KV-head group (G times the
    # parallelism at small batches; rows of an MMA do not mix, so the bits are equal)
    "DECODE_SPLIT_HEADS": (0, 1),
    # phase 2 issues block j+1's loads before block j's step (1: scores or weights, 2: the values too)
    "DECODE_PREFETCH": (0, 1, 2),
    # backward tiles set the order of the dq and dk/dv sums (frozen with the root's gradient bits)
    "BWD_BLOCK_M": (64,),
    "BWD_BLOCK_N": (64,),
    "bwd_num_warps": (4, 8),
    "bwd_num_stages": (1, 2),
}

CONFIG = {
    "BLOCK_N": 128,
    "BLOCK_N_INTERPRET": 8,
    "BLOCK_M": 128,
    "num_warps": 8,
    "num_stages": 2,
    "DECODE_BLOCK_M": 16,
    "DECODE_BLOCK_D": 64,
    "decode_num_warps": 4,
    "decode_num_stages": 3,
    "DECODE_PRECOMPUTE_P": 0,
    "DECODE_SPLIT_HEADS": 0,
    "DECODE_PREFETCH": 1,
    "decode2_num_warps": 8,
    "BWD_BLOCK_M": 64,
    "BWD_BLOCK_N": 64,
    "bwd_num_warps": 8,
    "bwd_num_stages": 1,
}

_LOG2E = 1.4426950408889634
#: columns of the ones matrix the softmax denominator is summed with (the smallest MMA N)
_L_COLS = 16


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _softmax_step(s, keep, m_i, l_i, acc, v, ones, qk_scale, P_TY: tl.constexpr, MASKED: tl.constexpr):
    """One KV block of the online softmax. Shared by every forward kernel: this is the reduction order."""
    s = s * qk_scale
    if MASKED:
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    # round p once; both the numerator and the denominator sum the same rounded weights
    p = p.to(P_TY).to(v.dtype)
    l_i = tl.dot(p, ones, l_i * alpha[:, None])
    acc = tl.dot(p, v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _attn_fwd_kernel(
    q_ptr,  # [B, Hq, S, D] or packed [T, Hq, D]
    k_ptr,  # [B, Hk, S, D] or packed [T, Hk, D]
    v_ptr,  # like k
    o_ptr,  # like q
    lse_ptr,  # fp32 [B, Hq, S] or [T, Hq]: log2-domain log-sum-exp of each row, for the backward
    cu_ptr,  # int32 [B + 1] sequence starts (VARLEN only)
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_ls,
    seq_len,  # S of the dense form (unused when VARLEN)
    n_kv_heads,
    qk_scale,  # softmax scale * log2(e)
    G: tl.constexpr,  # query heads per KV head
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    if VARLEN:
        start = tl.load(cu_ptr + b).to(tl.int64)
        L = (tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b)).to(tl.int32)
        b = b * 0
    else:
        start = b * 0
        L = seq_len
    if pid_m * BLOCK_M >= L * G:
        return
    P_TY: tl.constexpr = k_ptr.dtype.element_ty

    o_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_pos = o_i // G
    h = kvh * G + o_i % G
    m_row = q_pos < L
    o_d = tl.arange(0, D)
    p_q = q_ptr + b * stride_qb + h[:, None] * stride_qh + (start + q_pos[:, None]) * stride_qs + o_d[None, :]
    b_q = tl.load(p_q, mask=m_row[:, None], other=0.0)
    if UPCAST:
        b_q = b_q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + start * stride_ks
    v_base = v_ptr + b * stride_vb + kvh * stride_vh + start * stride_vs

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    ones = tl.full([BLOCK_N, 16], 1.0, dtype=b_q.dtype)

    # blocks visible to every row of the tile need no mask (a where() with an all-true mask is the identity)
    pos_lo = (pid_m * BLOCK_M) // G
    pos_hi = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, L)
    n_full = (pos_lo + 1) // BLOCK_N
    n_blocks = tl.cdiv(pos_hi, BLOCK_N)
    for j in range(0, n_full):
        k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :])
        b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :])
        if UPCAST:
            b_k = b_k.to(tl.float32)
            b_v = b_v.to(tl.float32)
        s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN]
        m_i, l_i, acc = _softmax_step(s, s, m_i, l_i, acc, b_v, ones, qk_scale, P_TY, False)
    for j in range(n_full, n_blocks):
        k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        m_k = k_pos < L
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :], mask=m_k[:, None], other=0.0)
        b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :], mask=m_k[:, None], other=0.0)
        if UPCAST:
            b_k = b_k.to(tl.float32)
            b_v = b_v.to(tl.float32)
        s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN]
        keep = (k_pos[None, :] <= q_pos[:, None]) & m_k[None, :]
        m_i, l_i, acc = _softmax_step(s, keep, m_i, l_i, acc, b_v, ones, qk_scale, P_TY, True)

    l_row = tl.max(l_i, 1)
    out = acc / l_row[:, None]
    p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + (start + q_pos[:, None]) * stride_os + o_d[None, :]
    tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])
    p_l = lse_ptr + b * stride_lb + h * stride_lh + (start + q_pos) * stride_ls
    tl.store(p_l, m_i + tl.math.log2(l_row), mask=m_row)


@triton.jit
def _attn_decode_scores_kernel(
    q_ptr,  # [B, Hq, 1, D]
    k_ptr,  # k cache [B, Hk, L, D]
    s_ptr,  # fp32 raw scores [B, Hq, L_pad]
    lens_ptr,  # [B] valid keys per sequence
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_sb, stride_sh,
    bm_ptr,  # fp32 [B, Hq, n_blocks]: per block, the row max of the scaled, masked scores (BLOCK_MAX only)
    stride_mb, stride_mh,
    qk_scale,
    n_kv_heads,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_MAX: tl.constexpr,
):
    j = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    L = tl.load(lens_ptr + b).to(tl.int32)
    if j * BLOCK_N >= L:
        return
    o_g = tl.arange(0, BLOCK_M)
    m_row = o_g < G
    h = kvh * G + o_g
    o_d = tl.arange(0, D)
    b_q = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + o_d[None, :], mask=m_row[:, None], other=0.0)
    k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
    m_k = k_pos < L
    p_k = k_ptr + b * stride_kb + kvh * stride_kh + k_pos[:, None] * stride_ks + o_d[None, :]
    b_k = tl.load(p_k, mask=m_k[:, None], other=0.0)
    if UPCAST:
        b_q = b_q.to(tl.float32)
        b_k = b_k.to(tl.float32)
    s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN], the raw scores exactly as prefill computes them
    p_s = s_ptr + b * stride_sb + h[:, None] * stride_sh + k_pos[None, :]
    tl.store(p_s, s, mask=m_row[:, None] & m_k[None, :])
    if BLOCK_MAX:
        # the block's share of _softmax_step's running max: max is exact and order-free
        s_max = tl.max(tl.where(m_k[None, :], s * qk_scale, float("-inf")), 1)
        tl.store(bm_ptr + b * stride_mb + h * stride_mh + j, s_max, mask=m_row)


@triton.jit
def _attn_decode_weights_kernel(
    s_ptr,  # fp32 raw scores [B, Hq, L_pad]
    bm_ptr,  # fp32 [B, Hq, n_blocks] block row maxima (from the scores kernel)
    p_ptr,  # [B, Hq, L_pad] in the input dtype: the rounded weights p of every block
    a_ptr,  # fp32 [B, Hq, n_blocks]: alpha, the rescale of the running sums entering each block
    lens_ptr,
    stride_sb, stride_sh,
    stride_mb, stride_mh,
    stride_pb, stride_ph,
    stride_ab, stride_ah,
    n_kv_heads,
    qk_scale,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Block j's p and alpha, as _softmax_step computes them inside the sequential loop.

    The running max entering block j is the max of the block maxima before j (the recurrence's
    m_i; max is exact, so chunking it changes nothing), m_new = maximum(m_i, block max of j),
    alpha = exp2(m_i - m_new), p = exp2(s * qk_scale - m_new) rounded to the input dtype: the same
    operations on the same values as the fused step, so the same bits.
    """
    j = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    L = tl.load(lens_ptr + b).to(tl.int32)
    if j * BLOCK_N >= L:
        return
    P_TY: tl.constexpr = p_ptr.dtype.element_ty
    o_g = tl.arange(0, BLOCK_M)
    m_row = o_g < G
    h = kvh * G + o_g
    bm_base = bm_ptr + b * stride_mb + h[:, None] * stride_mh
    # elementwise running max over the chunks, one row reduction after the loop: a reduction carried through
    # the loop trips an assertion in Triton 3.6's OptimizeThreadLocality pass (H200, attention_h200_run2.log)
    run = tl.full([BLOCK_M, CHUNK], float("-inf"), dtype=tl.float32)
    for c in range(0, tl.cdiv(j, CHUNK)):
        o_c = c * CHUNK + tl.arange(0, CHUNK)
        chunk = tl.load(bm_base + o_c[None, :], mask=m_row[:, None] & (o_c < j)[None, :], other=float("-inf"))
        run = tl.maximum(run, chunk)
    m_i = tl.max(run, 1)
    m_j = tl.load(bm_ptr + b * stride_mb + h * stride_mh + j, mask=m_row, other=0.0)
    m_new = tl.maximum(m_i, m_j)
    alpha = tl.math.exp2(m_i - m_new)
    k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
    m_k = k_pos < L
    s = tl.load(s_ptr + b * stride_sb + h[:, None] * stride_sh + k_pos[None, :], mask=m_row[:, None] & m_k[None, :],
                other=0.0)
    s = tl.where(m_k[None, :], s * qk_scale, float("-inf"))
    p = tl.math.exp2(s - m_new[:, None]).to(P_TY)
    tl.store(p_ptr + b * stride_pb + h[:, None] * stride_ph + k_pos[None, :], p, mask=m_row[:, None])
    tl.store(a_ptr + b * stride_ab + h * stride_ah + j, alpha, mask=m_row)


@triton.jit
def _decode_rows(pid, n_kv_heads, G: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    """(b, kv head, query heads [BLOCK_M], row mask) of a phase-2 program that owns ROWS of a group's G heads."""
    per_b = n_kv_heads * (G // ROWS)
    b = pid // per_b
    h0 = (pid % per_b) * ROWS
    o_g = tl.arange(0, BLOCK_M)
    return b, h0 // G, h0 + o_g, o_g < ROWS


@triton.jit
def _attn_decode_accumulate_kernel(
    p_ptr,  # [B, Hq, L_pad] weights from the weights kernel
    a_ptr,  # fp32 [B, Hq, n_blocks] alphas
    v_ptr,  # v cache [B, Hk, L, D]
    o_ptr,  # [B, Hq, 1, D]
    lens_ptr,
    stride_pb, stride_ph,
    stride_ab, stride_ah,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh,
    n_kv_heads,
    G: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Phase 2 on precomputed weights: per block, l = dot(p, ones, l * alpha), acc = dot(p, v, acc * alpha),
    in block order, exactly the tail of _softmax_step; nothing but the accumulation is left in the chain."""
    pid_d = tl.program_id(0)
    b, kvh, h, m_row = _decode_rows(tl.program_id(1).to(tl.int64), n_kv_heads, G, ROWS, BLOCK_M)
    L = tl.load(lens_ptr + b).to(tl.int32)
    o_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    p_base = p_ptr + b * stride_pb + h[:, None] * stride_ph
    a_base = a_ptr + b * stride_ab + h * stride_ah
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if UPCAST:
        ones = tl.full([BLOCK_N, 16], 1.0, dtype=tl.float32)
    else:
        ones = tl.full([BLOCK_N, 16], 1.0, dtype=p_ptr.dtype.element_ty)
    o_n = tl.arange(0, BLOCK_N)
    if PREFETCH >= 1:
        p_nx = tl.load(p_base + o_n[None, :], mask=m_row[:, None] & (o_n < L)[None, :], other=0.0)
        a_nx = tl.load(a_base, mask=m_row, other=1.0)
    if PREFETCH >= 2:
        v_nx = tl.load(v_base + o_n[:, None] * stride_vs + o_d[None, :], mask=(o_n < L)[:, None], other=0.0)
    for j in range(0, tl.cdiv(L, BLOCK_N)):
        k_pos = j * BLOCK_N + o_n
        m_k = k_pos < L
        if PREFETCH >= 1:  # as in _attn_decode_reduce_kernel
            p, alpha = p_nx, a_nx
            m_nx = (k_pos + BLOCK_N) < L
            p_nx = tl.load(p_base + (k_pos + BLOCK_N)[None, :], mask=m_row[:, None] & m_nx[None, :], other=0.0)
            a_nx = tl.load(a_base + j + 1, mask=m_row & ((h * 0 + (j + 1) * BLOCK_N) < L), other=1.0)
        else:
            p = tl.load(p_base + k_pos[None, :], mask=m_row[:, None] & m_k[None, :], other=0.0)
            alpha = tl.load(a_base + j, mask=m_row, other=1.0)
        if PREFETCH >= 2:
            b_v = v_nx
            v_nx = tl.load(v_base + (k_pos + BLOCK_N)[:, None] * stride_vs + o_d[None, :],
                           mask=((k_pos + BLOCK_N) < L)[:, None], other=0.0)
        else:
            b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :], mask=m_k[:, None], other=0.0)
        if UPCAST:
            b_v = b_v.to(tl.float32)
        p = p.to(b_v.dtype)
        l_i = tl.dot(p, ones, l_i * alpha[:, None])
        acc = tl.dot(p, b_v, acc * alpha[:, None])

    out = acc / tl.max(l_i, 1)[:, None]
    p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])


@triton.jit
def _attn_decode_reduce_kernel(
    s_ptr,  # fp32 raw scores [B, Hq, L_pad]
    v_ptr,  # v cache [B, Hk, L, D]
    o_ptr,  # [B, Hq, 1, D]
    lens_ptr,
    stride_sb, stride_sh,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh,
    n_kv_heads,
    qk_scale,
    G: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    pid_d = tl.program_id(0)
    b, kvh, h, m_row = _decode_rows(tl.program_id(1).to(tl.int64), n_kv_heads, G, ROWS, BLOCK_M)
    L = tl.load(lens_ptr + b).to(tl.int32)
    P_TY: tl.constexpr = v_ptr.dtype.element_ty
    o_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    s_base = s_ptr + b * stride_sb + h[:, None] * stride_sh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if UPCAST:
        ones = tl.full([BLOCK_N, 16], 1.0, dtype=tl.float32)
    else:
        ones = tl.full([BLOCK_N, 16], 1.0, dtype=P_TY)
    # PREFETCH: block j+1's loads are issued before block j's step runs, so the chain of dependent steps does
    # not wait a memory round trip per block (1: the scores, 2: the values too); same values, same order
    o_n = tl.arange(0, BLOCK_N)
    if PREFETCH >= 1:
        s_nx = tl.load(s_base + o_n[None, :], mask=m_row[:, None] & (o_n < L)[None, :], other=0.0)
    if PREFETCH >= 2:
        v_nx = tl.load(v_base + o_n[:, None] * stride_vs + o_d[None, :], mask=(o_n < L)[:, None], other=0.0)
    for j in range(0, tl.cdiv(L, BLOCK_N)):
        k_pos = j * BLOCK_N + o_n
        m_k = k_pos < L
        if PREFETCH >= 1:
            s = s_nx
            m_nx = (k_pos + BLOCK_N) < L
            s_nx = tl.load(s_base + (k_pos + BLOCK_N)[None, :], mask=m_row[:, None] & m_nx[None, :], other=0.0)
        else:
            s = tl.load(s_base + k_pos[None, :], mask=m_row[:, None] & m_k[None, :], other=0.0)
        if PREFETCH >= 2:
            b_v = v_nx
            v_nx = tl.load(v_base + (k_pos + BLOCK_N)[:, None] * stride_vs + o_d[None, :],
                           mask=((k_pos + BLOCK_N) < L)[:, None], other=0.0)
        else:
            b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :], mask=m_k[:, None], other=0.0)
        if UPCAST:
            b_v = b_v.to(tl.float32)
        m_i, l_i, acc = _softmax_step(s, m_k[None, :], m_i, l_i, acc, b_v, ones, qk_scale, P_TY, True)

    out = acc / tl.max(l_i, 1)[:, None]
    p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr,
    do_ptr,  # like q
    dq_ptr,  # like q (contiguous in the same layout)
    lse_ptr, delta_ptr,  # fp32, rows like q
    cu_ptr,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_lb, stride_lh, stride_ls,
    seq_len, n_kv_heads, qk_scale, sm_scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    if VARLEN:
        start = tl.load(cu_ptr + b).to(tl.int64)
        L = (tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b)).to(tl.int32)
        b = b * 0
    else:
        start = b * 0
        L = seq_len
    if pid_m * BLOCK_M >= L * G:
        return
    P_TY: tl.constexpr = k_ptr.dtype.element_ty
    o_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_pos = o_i // G
    h = kvh * G + o_i % G
    m_row = q_pos < L
    o_d = tl.arange(0, D)
    row_off = b * stride_qb + h[:, None] * stride_qh + (start + q_pos[:, None]) * stride_qs + o_d[None, :]
    b_q = tl.load(q_ptr + row_off, mask=m_row[:, None], other=0.0)
    b_do = tl.load(do_ptr + row_off, mask=m_row[:, None], other=0.0)
    l_off = b * stride_lb + h * stride_lh + (start + q_pos) * stride_ls
    b_lse = tl.load(lse_ptr + l_off, mask=m_row, other=0.0)
    b_delta = tl.load(delta_ptr + l_off, mask=m_row, other=0.0)
    if UPCAST:
        b_q = b_q.to(tl.float32)
        b_do = b_do.to(tl.float32)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + start * stride_ks
    v_base = v_ptr + b * stride_vb + kvh * stride_vh + start * stride_vs
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    pos_hi = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, L)
    for j in range(0, tl.cdiv(pos_hi, BLOCK_N)):
        k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        m_k = k_pos < L
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :], mask=m_k[:, None], other=0.0)
        b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :], mask=m_k[:, None], other=0.0)
        if UPCAST:
            b_k = b_k.to(tl.float32)
            b_v = b_v.to(tl.float32)
        s = tl.dot(b_q, tl.trans(b_k))
        keep = (k_pos[None, :] <= q_pos[:, None]) & m_k[None, :] & m_row[:, None]
        p = tl.where(keep, tl.math.exp2(s * qk_scale - b_lse[:, None]), 0.0)
        dp = tl.dot(b_do, tl.trans(b_v))
        ds = p * (dp - b_delta[:, None])
        dq = tl.dot(ds.to(P_TY).to(b_k.dtype), b_k, dq)
    dq = dq * sm_scale
    tl.store(dq_ptr + row_off, dq.to(dq_ptr.dtype.element_ty), mask=m_row[:, None])


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,
    dk_ptr, dv_ptr,  # like k
    lse_ptr, delta_ptr,
    cu_ptr,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_lb, stride_lh, stride_ls,
    seq_len, n_kv_heads, qk_scale, sm_scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    if VARLEN:
        start = tl.load(cu_ptr + b).to(tl.int64)
        L = (tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b)).to(tl.int32)
        b = b * 0
    else:
        start = b * 0
        L = seq_len
    if pid_n * BLOCK_N >= L:
        return
    P_TY: tl.constexpr = k_ptr.dtype.element_ty
    o_d = tl.arange(0, D)
    k_pos = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_k = k_pos < L
    k_off = b * stride_kb + kvh * stride_kh + (start + k_pos[:, None]) * stride_ks + o_d[None, :]
    v_off = b * stride_vb + kvh * stride_vh + (start + k_pos[:, None]) * stride_vs + o_d[None, :]
    b_k = tl.load(k_ptr + k_off, mask=m_k[:, None], other=0.0)
    b_v = tl.load(v_ptr + v_off, mask=m_k[:, None], other=0.0)
    if UPCAST:
        b_k = b_k.to(tl.float32)
        b_v = b_v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    # rows (position, head) in order; the first tile that can see this block starts at position pid_n*BLOCK_N
    i_lo = (pid_n * BLOCK_N * G) // BLOCK_M * BLOCK_M
    for i0 in range(i_lo, L * G, BLOCK_M):
        o_i = i0 + tl.arange(0, BLOCK_M)
        q_pos = o_i // G
        h = kvh * G + o_i % G
        m_row = q_pos < L
        row_off = b * stride_qb + h[:, None] * stride_qh + (start + q_pos[:, None]) * stride_qs + o_d[None, :]
        b_q = tl.load(q_ptr + row_off, mask=m_row[:, None], other=0.0)
        b_do = tl.load(do_ptr + row_off, mask=m_row[:, None], other=0.0)
        l_off = b * stride_lb + h * stride_lh + (start + q_pos) * stride_ls
        b_lse = tl.load(lse_ptr + l_off, mask=m_row, other=0.0)
        b_delta = tl.load(delta_ptr + l_off, mask=m_row, other=0.0)
        if UPCAST:
            b_q = b_q.to(tl.float32)
            b_do = b_do.to(tl.float32)
        s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN]
        keep = (k_pos[None, :] <= q_pos[:, None]) & m_k[None, :] & m_row[:, None]
        p = tl.where(keep, tl.math.exp2(s * qk_scale - b_lse[:, None]), 0.0)
        dv = tl.dot(tl.trans(p.to(P_TY).to(b_do.dtype)), b_do, dv)
        dp = tl.dot(b_do, tl.trans(b_v))
        ds = p * (dp - b_delta[:, None])
        dk = tl.dot(tl.trans(ds.to(P_TY).to(b_q.dtype)), b_q, dk)
    dk = dk * sm_scale
    tl.store(dk_ptr + k_off, dk.to(dk_ptr.dtype.element_ty), mask=m_k[:, None])
    tl.store(dv_ptr + v_off, dv.to(dv_ptr.dtype.element_ty), mask=m_k[:, None])


# ----------------------------------------------------------------------------- host launchers


def _tiles() -> dict:
    """Effective tile sizes. The interpreter gets small tiles so tiny shapes still span several KV blocks."""
    if INTERPRET:
        return {**CONFIG, "BLOCK_N": CONFIG["BLOCK_N_INTERPRET"], "BLOCK_M": 16, "DECODE_BLOCK_M": 16,
                "DECODE_BLOCK_D": 16, "BWD_BLOCK_M": 16, "BWD_BLOCK_N": CONFIG["BLOCK_N_INTERPRET"]}
    return CONFIG


def _launch_opts(warps: int, stages: int) -> dict:
    return {"num_warps": warps, "num_stages": stages, "enable_fp_fusion": False}


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int, hq: int, hk: int) -> int:
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"attention takes bf16/fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if head_dim not in (16, 32, 64, 128, 256):
        raise ValueError(f"head dim {head_dim} not supported (16, 32, 64, 128 or 256)")
    if hk == 0 or hq % hk:
        raise ValueError(f"{hq} query heads are not a multiple of {hk} KV heads")
    return hq // hk


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _row_strides(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, position) strides of a [B, H, S, D] tensor, or of a packed [T, H, D] one (batch 0)."""
    if varlen:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def _fwd(q, k, v, cu, n_seq, max_len, seq_len, scale, varlen):
    """Launch the fused forward; q/k/v last dim contiguous. Returns (o, lse)."""
    cfg = _tiles()
    hq, hk, d = q.shape[-2 if varlen else 1], k.shape[-2 if varlen else 1], q.shape[-1]
    G = hq // hk
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    lse_strides = (0, lse.stride(1), lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1), lse.stride(2))
    grid = (triton.cdiv(max_len * G, cfg["BLOCK_M"]), n_seq * hk)
    _attn_fwd_kernel[grid](
        q, k, v, o, lse, cu,
        *_row_strides(q, varlen), *_row_strides(k, varlen), *_row_strides(v, varlen), *_row_strides(o, varlen),
        *lse_strides, seq_len, hk, scale * _LOG2E,
        G=G, D=d, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], VARLEN=varlen, UPCAST=INTERPRET,
        **_launch_opts(cfg["num_warps"], cfg["num_stages"]),
    )
    return o, lse


def _bwd(q, k, v, o, lse, do, cu, n_seq, max_len, seq_len, scale, varlen):
    cfg = _tiles()
    hq, hk, d = q.shape[-2 if varlen else 1], k.shape[-2 if varlen else 1], q.shape[-1]
    G = hq // hk
    do = do.contiguous()
    # delta = rowsum(o * dO): a fixed-shape torch reduction, deterministic
    delta = (o.float() * do.float()).sum(-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse_strides = (0, lse.stride(1), lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1), lse.stride(2))
    common = dict(G=G, D=d, BLOCK_M=cfg["BWD_BLOCK_M"], BLOCK_N=cfg["BWD_BLOCK_N"], VARLEN=varlen, UPCAST=INTERPRET,
                  **_launch_opts(cfg["bwd_num_warps"], cfg["bwd_num_stages"]))
    strides = (*_row_strides(q, varlen), *_row_strides(k, varlen), *_row_strides(v, varlen), *lse_strides)
    grid = (triton.cdiv(max_len * G, cfg["BWD_BLOCK_M"]), n_seq * hk)
    _attn_bwd_dq_kernel[grid](q, k, v, do, dq, lse, delta, cu, *strides, seq_len, hk, scale * _LOG2E, scale,
                              **common)
    grid = (triton.cdiv(max_len, cfg["BWD_BLOCK_N"]), n_seq * hk)
    _attn_bwd_dkdv_kernel[grid](q, k, v, do, dk, dv, lse, delta, cu, *strides, seq_len, hk, scale * _LOG2E, scale,
                                **common)
    return dq, dk, dv


def _decode(q, k_cache, v_cache, lens, scale):
    cfg = _tiles()
    B, hq, _, d = q.shape
    hk, cap = k_cache.shape[1], k_cache.shape[2]
    G = hq // hk
    bm = max(cfg["DECODE_BLOCK_M"], triton.next_power_of_2(G))
    bd = min(cfg["DECODE_BLOCK_D"], d)
    bn = cfg["BLOCK_N"]
    lens = lens.to(device=q.device, dtype=torch.int32).contiguous()
    n_blocks = triton.cdiv(cap, bn)
    scores = torch.empty((B, hq, n_blocks * bn), dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    opts = _launch_opts(cfg["decode_num_warps"], cfg["decode_num_stages"])
    # phase 2 (the sequential chain) may want fewer warps than the parallel kernels: 0 = decode_num_warps
    opts2 = _launch_opts(cfg.get("decode2_num_warps") or cfg["decode_num_warps"], cfg["decode_num_stages"])
    pre = bool(cfg.get("DECODE_PRECOMPUTE_P", 0))
    # phase 2 rows per program: the whole group (its heads share each V load) or one head (G times the programs)
    rows = 1 if cfg.get("DECODE_SPLIT_HEADS", 0) else G
    bm2 = max(cfg["DECODE_BLOCK_M"] if rows == G else 16, triton.next_power_of_2(rows))
    bmax = torch.empty((B, hq, n_blocks), dtype=torch.float32, device=q.device) if pre else scores
    qk_scale = scale * _LOG2E
    _attn_decode_scores_kernel[(n_blocks, B * hk)](
        q, k_cache, scores, lens,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        scores.stride(0), scores.stride(1), bmax, bmax.stride(0), bmax.stride(1), qk_scale, hk,
        G=G, D=d, BLOCK_M=bm, BLOCK_N=bn, UPCAST=INTERPRET, BLOCK_MAX=pre, **opts,
    )
    if pre:
        p = torch.empty((B, hq, n_blocks * bn), dtype=v_cache.dtype, device=q.device)
        alpha = torch.empty((B, hq, n_blocks), dtype=torch.float32, device=q.device)
        _attn_decode_weights_kernel[(n_blocks, B * hk)](
            scores, bmax, p, alpha, lens,
            scores.stride(0), scores.stride(1), bmax.stride(0), bmax.stride(1), p.stride(0), p.stride(1),
            alpha.stride(0), alpha.stride(1), hk, qk_scale,
            G=G, BLOCK_M=bm, BLOCK_N=bn, CHUNK=4 if INTERPRET else 64, **opts,
        )
        _attn_decode_accumulate_kernel[(d // bd, B * hk * (G // rows))](
            p, alpha, v_cache, o, lens,
            p.stride(0), p.stride(1), alpha.stride(0), alpha.stride(1),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), o.stride(0), o.stride(1), hk,
            G=G, ROWS=rows, BLOCK_M=bm2, BLOCK_N=bn, BLOCK_D=bd, UPCAST=INTERPRET,
            PREFETCH=cfg.get("DECODE_PREFETCH", 0), **opts2,
        )
        return o
    _attn_decode_reduce_kernel[(d // bd, B * hk * (G // rows))](
        scores, v_cache, o, lens,
        scores.stride(0), scores.stride(1), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o.stride(0), o.stride(1), hk, qk_scale,
        G=G, ROWS=rows, BLOCK_M=bm2, BLOCK_N=bn, BLOCK_D=bd, UPCAST=INTERPRET,
        PREFETCH=cfg.get("DECODE_PREFETCH", 0), **opts2,
    )
    return o


# ----------------------------------------------------------------------------- autograd


class AttentionFunction(torch.autograd.Function):
    """Causal GQA attention over dense [B, H, S, D] or packed [T, H, D] sequences, with its backward."""

    @staticmethod
    def forward(ctx, q, k, v, cu, n_seq, max_len, seq_len, scale, varlen):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        o, lse = _fwd(q, k, v, cu, n_seq, max_len, seq_len, scale, varlen)
        ctx.save_for_backward(q, k, v, o, lse, cu)
        ctx.meta = (n_seq, max_len, seq_len, scale, varlen)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu = ctx.saved_tensors
        dq, dk, dv = _bwd(q, k, v, o, lse, do, cu, *ctx.meta)
        return dq, dk, dv, None, None, None, None, None, None


# ----------------------------------------------------------------------------- entry points


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal GQA attention over full sequences: q [B, Hq, S, D], k/v [B, Hk, S, D] -> [B, Hq, S, D].

    Also the training forward over prompt + answer (differentiable). `scale` defaults to 1/sqrt(D).
    """
    B, hq, S, d = q.shape
    if k.shape != (B, k.shape[1], S, d) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    _check_heads(q, k, v, d, hq, k.shape[1])
    cu = torch.zeros(1, dtype=torch.int32, device=q.device)
    if B == 0 or S == 0:
        return torch.zeros_like(q)
    return AttentionFunction.apply(q, k, v, cu, B, S, S, _scale(scale, d), False)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Causal GQA attention over packed sequences: q [T, Hq, D], k/v [T, Hk, D], cu_seqlens [N + 1] -> [T, Hq, D].

    Sequence i is rows cu_seqlens[i] : cu_seqlens[i + 1]; positions restart at 0 in each sequence, so every row
    has the bits it has in `attention_prefill` of that sequence alone. Differentiable.
    """
    T, hq, d = q.shape
    if k.shape[0] != T or k.shape[2] != d or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    _check_heads(q, k, v, d, hq, k.shape[1])
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    n_seq = cu.numel() - 1
    if max_seqlen is None:
        max_seqlen = int((cu[1:] - cu[:-1]).max()) if n_seq > 0 else 0
    if n_seq <= 0 or T == 0 or max_seqlen == 0:
        return torch.zeros_like(q)
    return AttentionFunction.apply(q, k, v, cu, n_seq, max_seqlen, 0, _scale(scale, d), True)


def attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """One query per sequence against its KV cache: q [B, Hq, 1, D], caches [B, Hk, L, D], lens [B] -> [B, Hq, 1, D].

    lens[b] >= 1 keys are valid (the query sits at position lens[b] - 1); the result has the bits of row
    lens[b] - 1 of `attention_prefill` over those keys. Entries past lens[b] are never read into the result.
    """
    B, hq, one, d = q.shape
    if one != 1:
        raise ValueError(f"decode takes one query per sequence, got q {tuple(q.shape)}")
    if k_cache.shape[0] != B or k_cache.shape[3] != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not match q {tuple(q.shape)}")
    _check_heads(q, k_cache, v_cache, d, hq, k_cache.shape[1])
    if lens.shape != (B,):
        raise ValueError(f"lens must be [B] = [{B}], got {tuple(lens.shape)}")
    if B == 0:
        return torch.zeros_like(q)
    q = q if q.stride(-1) == 1 else q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("KV caches must be contiguous in the head dim")
    with torch.no_grad():
        return _decode(q, k_cache, v_cache, lens, _scale(scale, d))
