"""The attention root's prefill forward on a Hopper GPU, written in Gluon (Triton's explicit-layout dialect).

`attention._fwd` launches this kernel instead of `_attn_fwd_kernel` where it applies (CONFIG's FWD_GLUON, bf16, head dim
128, a Hopper GPU with Triton's Gluon, K and V readable through TMA: `attention._gluon_applies`): dense prefill, and
packed (varlen) sequences with FWD_GLUON_VARLEN (on since its bit tests ran green on an H100 in session 42). It
computes the same tree with the same operations, so it changes which kernel runs, never a bit: the contract's root_bits
and `tests/kernels/test_gluon_attn_fwd.py` compare its o and lse with the Triton kernel's, bit for bit.

Why. On an H100 the Triton forward takes 0.85-1.06x SDPA flash's time (issue #16 asks 0.85x); this one 0.64-0.85x
(results/gluon_fwd_h100.md). The Triton launch (64 rows, 4 warps, one stage: two programs an SM) loads a block's K
and V at the top of each step and waits for them there, so a program's load latency is hidden only by the other
program on its SM; two stages would take the shared memory of the second program. Triton's `tl` cannot say "start
loading block j + 1's K as soon as block j's QK product has read the buffer", which keeps one buffer each for K and
V (two programs an SM still fit) and hides the load behind the softmax and the PV product. Gluon can: here each step
waits for its K, issues Q K^T, and once that product is done sends the tensor-memory accelerator for the next
block's K into the same buffer; then the softmax, then it waits for its V, issues P V (and P @ ones, the
denominator) and, once done, sends for the next block's V.

What must hold. The same reduction tree and the same operations as `tik_kernels.ops.attention._attn_fwd_kernel` (its
docstring), so the same bits: KV blocks of 128 keys, chunks of 4 blocks by absolute position, each chunk's online
softmax from the empty state through `_softmax_step`'s operations in its order, chunks merged into the running total
in order with `_merge` / `_merge_sum`'s formula, out = acc / l and lse = m + log2(l); fp contraction off. The
diagonal blocks inside the sequence are masked as the root's one loop masks them; a block crossing the sequence's end
is read through pointers with zeros past the end, as the root's second loop reads it (a TMA read there would bring
the next sequence's rows, and 0 x NaN is NaN). Whether the MMAs give these operands the root's bits is the GPU's to
say, and it said yes on an H100 (results/pytest_gpu_h100_gluon_fwd.log).

Scope: causal GQA prefill, dense (q [B, Hq, S, D], k/v [B, Hk, S, D]) or packed (q [T, Hq, D] with cu_seqlens),
bf16, head dim 128, the root's GPU tree (BLOCK_N 128, CHUNK_BLOCKS 4); 64 rows of 4 warps (the root's launch) or,
for A/B timings, 128 of 8 (two warpgroups sharing each K and V block) and loads without the early send
(tik_kernels/experimental/gluon_attn_fwd.py). The CPU interpreter cannot run Gluon: only `attention._fwd` on a
Hopper GPU, the GPU tests and the benchmarks import this module.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

#: the root's GPU tree (frozen there) and this kernel's one launch
BLOCK_N = 128
CHUNK_BLOCKS = 4
BLOCK_M = 64
HEAD_DIM = 128
#: columns of the ones matrix the denominator is summed with (the root's `_L_COLS`)
L_COLS = 16


@gluon.constexpr_function
def load_layout(warps):
    """Rows of 128 bf16 read through pointers (Q, the ones, a block crossing the sequence's end): 8 contiguous values
    (16 bytes) a thread, a warp 4 rows of 64; every Gluon forward's."""
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[warps, 1], order=[1, 0])


@gluon.constexpr_function
def mma_layout(warps, n):
    """A warpgroup MMA's accumulator over `warps` warps (16 rows each), n columns an instruction: the layout of the
    scores, P V's accumulator (n = BLOCK_N) and the denominator's P @ ones (n = L_COLS); every Gluon forward's."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _merge(m_a, m_b):
    """The root's `_merge`: the new max and both rescales."""
    m = gl.maximum(m_a, m_b)
    m_sub = gl.where(m == float("-inf"), 0.0, m)
    return m, gl.exp2(m_a - m_sub), gl.exp2(m_b - m_sub)


@gluon.jit
def _fold(m_t, l_t, acc_t, m_i, l_i, acc, ROW_L: gl.constexpr):
    """The root's `_fold_chunk` with the total in registers: merge a finished chunk state into the running total."""
    m_t, a_t, a_i = _merge(m_t, m_i)
    a_tl = gl.expand_dims(gl.convert_layout(a_t, ROW_L), 1)
    a_il = gl.expand_dims(gl.convert_layout(a_i, ROW_L), 1)
    l_t = l_t * a_tl + l_i * a_il
    acc_t = acc_t * gl.expand_dims(a_t, 1) + acc * gl.expand_dims(a_i, 1)
    return m_t, l_t, acc_t


@gluon.jit
def _step(s, keep, m_i, l_i, acc, v_smem, ones_smem, qk_scale, MASKED: gl.constexpr, P_OP: gl.constexpr,
          P_OP_L: gl.constexpr, ROW_L: gl.constexpr):
    """The root's `_softmax_step` on one KV block, the PV and denominator products issued and waited for here."""
    s = s * qk_scale
    if MASKED:
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_sub)
    p = gl.exp2(s - gl.expand_dims(m_sub, 1)).to(gl.bfloat16)
    l_i = l_i * gl.expand_dims(gl.convert_layout(alpha, ROW_L), 1)
    acc = acc * gl.expand_dims(alpha, 1)
    l_i = warpgroup_mma(gl.convert_layout(p, P_OP_L), ones_smem, l_i, is_async=True)
    acc = warpgroup_mma(gl.convert_layout(p, P_OP), v_smem, acc, is_async=True)
    # done with V's buffer too (its next load is sent after this returns)
    l_i, acc, _ = warpgroup_mma_wait(num_outstanding=0, deps=(l_i, acc, v_smem))
    return m_new, l_i, acc


@gluon.jit
def _block(s, keep, masked, m_i, l_i, acc, v_smem, ones_smem, qk_scale, P_OP: gl.constexpr, P_OP_L: gl.constexpr,
           ROW_L: gl.constexpr):
    """`_step` on one block, its mask applied where `masked` (a block some row must not see all of): the select is
    compiled into that branch only."""
    if masked:
        m_i, l_i, acc = _step(s, keep, m_i, l_i, acc, v_smem, ones_smem, qk_scale, True, P_OP, P_OP_L, ROW_L)
    else:
        m_i, l_i, acc = _step(s, keep, m_i, l_i, acc, v_smem, ones_smem, qk_scale, False, P_OP, P_OP_L, ROW_L)
    return m_i, l_i, acc


@gluon.jit
def _chunk_end(j, CHUNK: gl.constexpr, m_t, l_t, acc_t, m_i, l_i, acc, ROW_L: gl.constexpr):
    """After block j: at a chunk's last block, its state merged into the running total and the next chunk's state
    started empty (m = -inf, l = acc = 0)."""
    if j % CHUNK == CHUNK - 1:
        m_t, l_t, acc_t = _fold(m_t, l_t, acc_t, m_i, l_i, acc, ROW_L)
        m_i = gl.full_like(m_i, float("-inf"))
        l_i = gl.zeros_like(l_i)
        acc = gl.zeros_like(acc)
    return m_t, l_t, acc_t, m_i, l_i, acc


@gluon.jit
def _store(o_ptr, lse_ptr, m_t, l_t, acc_t, b, kvh, o_i, start, L, stride_ob, stride_oh, stride_os, stride_lb,
           stride_lh, stride_ls, G: gl.constexpr, D: gl.constexpr, ROW: gl.constexpr, COL: gl.constexpr):
    """out = acc / l and lse = m + log2(l) of rows o_i (the root's epilogue), stored where the row's position is in
    the sequence. From the MMA's layout: converting to a load layout for wider stores cost 20-23 spill stores a block
    in the walk's loop (sm_90, Triton 3.6), the registers being allocated for the whole kernel at once."""
    l_row = gl.max(l_t, 1)
    out = acc_t / gl.expand_dims(gl.convert_layout(l_row, ROW), 1)
    q_pos = o_i // G
    h = kvh * G + o_i % G
    m_row = q_pos < L
    p_o = (o_ptr + b * stride_ob + gl.expand_dims(h * stride_oh + (start + q_pos) * stride_os, 1)
           + gl.expand_dims(gl.arange(0, D, layout=COL), 0))
    gl.store(p_o, out.to(gl.bfloat16), mask=gl.expand_dims(m_row, 1))
    p_l = lse_ptr + b * stride_lb + h * stride_lh + (start + q_pos) * stride_ls
    gl.store(p_l, m_t + gl.log2(gl.convert_layout(l_row, ROW)), mask=m_row)


@gluon.jit
def _attn_fwd_gluon_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q, o [B, Hq, S, D] or packed [T, Hq, D]; k, v likewise; lse fp32 [B, Hq, S]
    cu_ptr,  # int32 [N + 1] sequence starts (VARLEN only)
    k_desc, v_desc,  # K and V as rows of positions (the root's `_kv_descriptor`): block (b, kvh, pos) at row
    k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,  # b*rb + kvh*rh + pos, column kvh*ch
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_ls,
    seq_len,  # S of the dense form (unused when VARLEN)
    n_kv_heads,
    qk_scale,  # softmax scale * log2(e)
    G: gl.constexpr,
    D: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CHUNK: gl.constexpr,
    L_COLS: gl.constexpr,
    PREFETCH: gl.constexpr = True,  # False: each step sends for its own K and V and waits (the root's one stage)
    VARLEN: gl.constexpr = False,
):
    # every warp owns 16 rows (a warpgroup 64): a row's products never leave its warpgroup (P stays in registers)
    WARPS: gl.constexpr = BLOCK_M // 16
    MMA: gl.constexpr = mma_layout(WARPS, BLOCK_N)
    MMA_L: gl.constexpr = mma_layout(WARPS, L_COLS)
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    P_OP_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_L, k_width=2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA_L)
    LOAD: gl.constexpr = load_layout(WARPS)
    LROW: gl.constexpr = gl.SliceLayout(1, LOAD)
    LCOL: gl.constexpr = gl.SliceLayout(0, LOAD)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.bfloat16)
    ONES_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, L_COLS], gl.bfloat16)

    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1).to(gl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    # the root's `_sequence`: a packed sequence is rows cu[b] ... cu[b + 1] - 1 of batch 0
    if VARLEN:
        start = gl.load(cu_ptr + b).to(gl.int64)
        L = (gl.load(cu_ptr + b + 1) - gl.load(cu_ptr + b)).to(gl.int32)
        b = b * 0
    else:
        start = b * 0
        L = seq_len
    if pid_m * BLOCK_M >= L * G:
        return

    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D], v_desc.layout)
    k_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(k_bar, count=1)
    mbarrier.init(v_bar, count=1)
    fence_async_shared()  # the barriers' initialization seen by the TMA unit

    # which blocks the tile walks: the root's one loop over the blocks wholly inside the sequence (through TMA, the
    # diagonal ones masked), then at most one crossing the sequence's end
    pos_lo = (pid_m * BLOCK_M) // G
    pos_hi = gl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, L)
    n_full = (pos_lo + 1) // BLOCK_N
    n_blocks = gl.cdiv(pos_hi, BLOCK_N)
    n_in = gl.minimum(n_blocks, L // BLOCK_N)
    k_row = (b * k_rb + kvh * k_rh + start).to(gl.int32)
    v_row = (b * v_rb + kvh * v_rh + start).to(gl.int32)
    k_col = (kvh * k_ch).to(gl.int32)
    v_col = (kvh * v_ch).to(gl.int32)
    # PREFETCH: the first block's K and V are sent for before Q is read, so the two loads overlap
    first = (n_in > 0) & PREFETCH
    mbarrier.expect(k_bar, k_desc.block_type.nbytes, pred=first)
    tma.async_copy_global_to_shared(k_desc, [k_row, k_col], k_bar, k_smem, pred=first)
    mbarrier.expect(v_bar, v_desc.block_type.nbytes, pred=first)
    tma.async_copy_global_to_shared(v_desc, [v_row, v_col], v_bar, v_smem, pred=first)

    # Q, through pointers (its rows interleave the group's heads), into shared memory for the QK products
    lo_i = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=LROW)
    lo_d = gl.arange(0, D, layout=LCOL)
    lq_pos = lo_i // G
    lh = kvh * G + lo_i % G
    p_q = (q_ptr + b * stride_qb + gl.expand_dims(lh * stride_qh + (start + lq_pos) * stride_qs, 1)
           + gl.expand_dims(lo_d, 0))
    b_q = gl.load(p_q, mask=gl.expand_dims(lq_pos < L, 1), other=0.0)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D], Q_SMEM, b_q)
    ones_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, L_COLS], ONES_SMEM,
                                          gl.full([BLOCK_N, L_COLS], 1.0, gl.bfloat16, layout=LOAD))
    # Q's and the ones' stores (every thread's) seen by the MMAs' asynchronous reads: a proxy fence, then all arrive
    fence_async_shared()
    gl.thread_barrier()

    o_i = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW)
    q_pos = o_i // G

    # the running total and the current chunk's state, both the empty state
    m_t = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW)
    l_t = gl.zeros([BLOCK_M, L_COLS], gl.float32, layout=MMA_L)
    acc_t = gl.zeros([BLOCK_M, D], gl.float32, layout=MMA)
    m_i, l_i, acc = m_t, l_t, acc_t
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=MMA)

    for j in range(0, n_in):
        phase = j & 1
        nxt = (j + 1 < n_in) & PREFETCH
        if not PREFETCH:
            gl.thread_barrier()  # every warp done with the step before's products, which read these buffers
            mbarrier.expect(k_bar, k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [k_row + j * BLOCK_N, k_col], k_bar, k_smem)
            mbarrier.expect(v_bar, v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [v_row + j * BLOCK_N, v_col], v_bar, v_smem)
        mbarrier.wait(k_bar, phase)
        s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, k_smem))
        # K's buffer is free once every warp has seen its product done (at 128 rows the other warpgroup's product
        # reads it too): the next block's K loads behind this block's softmax and PV product
        if PREFETCH:
            gl.thread_barrier()
        mbarrier.expect(k_bar, k_desc.block_type.nbytes, pred=nxt)
        tma.async_copy_global_to_shared(k_desc, [k_row + (j + 1) * BLOCK_N, k_col], k_bar, k_smem, pred=nxt)
        k_pos = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=COL)
        keep = gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos, 1)
        mbarrier.wait(v_bar, phase)
        m_i, l_i, acc = _block(s, keep, j >= n_full, m_i, l_i, acc, v_smem, ones_smem, qk_scale, P_OP, P_OP_L, ROW_L)
        # V's buffer is free once every warp has seen its products done: the next block's V loads behind the next QK
        # product and softmax
        if PREFETCH:
            gl.thread_barrier()
        mbarrier.expect(v_bar, v_desc.block_type.nbytes, pred=nxt)
        tma.async_copy_global_to_shared(v_desc, [v_row + (j + 1) * BLOCK_N, v_col], v_bar, v_smem, pred=nxt)
        m_t, l_t, acc_t, m_i, l_i, acc = _chunk_end(j, CHUNK, m_t, l_t, acc_t, m_i, l_i, acc, ROW_L)
    # the block crossing the sequence's end (at most one): through pointers, zeros past the end
    for j in range(n_in, n_blocks):
        lk_pos = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=LROW)
        lm_k = gl.expand_dims(lk_pos < L, 1)
        p_k = (k_ptr + b * stride_kb + kvh * stride_kh + gl.expand_dims((start + lk_pos) * stride_ks, 1)
               + gl.expand_dims(lo_d, 0))
        p_v = (v_ptr + b * stride_vb + kvh * stride_vh + gl.expand_dims((start + lk_pos) * stride_vs, 1)
               + gl.expand_dims(lo_d, 0))
        k_smem.store(gl.load(p_k, mask=lm_k, other=0.0))
        v_smem.store(gl.load(p_v, mask=lm_k, other=0.0))
        fence_async_shared()
        gl.thread_barrier()
        s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, k_smem))
        k_pos = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=COL)
        keep = (gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos, 1)) & gl.expand_dims(k_pos < L, 0)
        m_i, l_i, acc = _step(s, keep, m_i, l_i, acc, v_smem, ones_smem, qk_scale, True, P_OP, P_OP_L, ROW_L)
        m_t, l_t, acc_t, m_i, l_i, acc = _chunk_end(j, CHUNK, m_t, l_t, acc_t, m_i, l_i, acc, ROW_L)
        gl.thread_barrier()  # every warp's products read the buffers before another block is stored there
    # the last, partial chunk (the empty state if the walk ended on a chunk edge: then the merge is the identity)
    m_t, l_t, acc_t = _fold(m_t, l_t, acc_t, m_i, l_i, acc, ROW_L)
    mbarrier.invalidate(k_bar)
    mbarrier.invalidate(v_bar)

    _store(o_ptr, lse_ptr, m_t, l_t, acc_t, b, kvh, o_i, start, L, stride_ob, stride_oh, stride_os, stride_lb,
           stride_lh, stride_ls, G, D, ROW, COL)


def _descriptor(t: torch.Tensor, made):
    """Gluon's TMA descriptor over K or V from the root's (`attention._kv_descriptor`'s (descriptor, rows)): the same
    matrix of positions, the same [BLOCK_N, 128] block, with the shared layout the kernel's buffers take."""
    desc = made[0]
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.bfloat16)
    return TensorDescriptor(t, list(desc.shape), list(desc.strides), [BLOCK_N, HEAD_DIM], layout)


def launch(q, k, v, o, lse, cu, k_made, v_made, strides, seq_len: int, n_seq: int, max_len: int, hk: int, G: int,
           qk_scale: float, varlen: bool, prefetch: bool = True, block_m: int = BLOCK_M) -> None:
    """The forward into o and lse, from the arguments the root's `_fwd` launches its Triton kernel with: K's and V's
    descriptors as `attention._kv_descriptor` made them ((descriptor, (rb, rh, ch))), the (batch, head, position)
    strides of q, k, v, o and lse (15 integers, `_row_strides`' order), the dense length (0 when varlen), the
    sequences and their longest length, the KV heads, the group size and softmax scale * log2(e). prefetch=False:
    every step sends for its own K and V and waits for them (the Triton kernel's schedule, for an A/B of the loads
    alone). block_m: rows a program, 64 (one warpgroup, two programs an SM) or 128 (two warpgroups of 64 rows
    sharing each K and V block, one program an SM: registers)."""
    if block_m not in (64, 128):
        raise ValueError(f"block_m must be 64 or 128, got {block_m}")
    _attn_fwd_gluon_kernel[(triton.cdiv(max_len * G, block_m), n_seq * hk)](
        q, k, v, o, lse, cu, _descriptor(k, k_made), _descriptor(v, v_made), *k_made[1], *v_made[1], *strides,
        seq_len, hk, qk_scale,
        G=G, D=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=BLOCK_N, CHUNK=CHUNK_BLOCKS, L_COLS=L_COLS, PREFETCH=prefetch,
        VARLEN=varlen, num_warps=block_m // 16, enable_fp_fusion=False,
    )
