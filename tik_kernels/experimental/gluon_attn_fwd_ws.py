"""The attention root's prefill forward in Gluon, warp-specialized: a producer warp and two consumer warpgroups.

An experiment beside `tik_kernels/ops/attention_gluon.py` (the root's Gluon forward on Hopper; its docstring says why
the loads are the thing to move). Here a program owns two 64-row tiles of one (sequence, KV head); each tile is a
consumer warpgroup with its own online softmax state, and one producer warp streams the K and V blocks both tiles walk
through a ring of two K and two V buffers with the tensor-memory accelerator (`mbarrier`s: ready when a block has
landed, empty when both consumers have read it). The two warpgroups run independently, so one's softmax overlaps the
other's products and the loads run ahead of both; the consumers get 240 registers a thread, the producer 24.

The tree and the operations are the root's, as in `tik_kernels/ops/attention_gluon.py` (its `_step`, `_fold`). A tile
whose walk is a block shorter than its neighbour's walks that block too, fully masked: a fully masked block leaves a
chunk's state unchanged and the empty state's merge is the identity (the root's docstring), so the bits are the root's.

One difference in what the kernel reads: every block comes through TMA, the one crossing the sequence's end too, so rows
past the end are the next head's or sequence's (or zeros past the tensor); their scores are masked to -inf and their P
is exactly 0, which keeps the root's bits for finite values but lets a NaN or Inf stored there through (0 x NaN). The
root reads that block through pointers with zeros past the end. Fine for dense prefill of real activations; not for a
cache with poisoned rows.

Scope: dense prefill, bf16, head dim 128, a Hopper GPU with Gluon. A warp-specialized kernel that waits on a barrier no
one arrives at hangs: `gpu_pending.sh gluon_fwd_ws` runs its test and timing apart from the other forms, last.
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

from tik_kernels.experimental import gluon_attn_fwd as forms
from tik_kernels.ops import attention_gluon as base

#: registers a thread: each consumer warpgroup, the producer warp (a warpgroup's allocation is 4 warps')
CONSUMER_REGS = gl.constexpr(240)
PRODUCER_REGS = gl.constexpr(24)


@gluon.jit
def _consumer(args, G: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CHUNK: gl.constexpr, L_COLS: gl.constexpr, WHICH: gl.constexpr):
    """Row tile 2 * pid + WHICH: walks every block the producer streams, in order, through the root's steps."""
    (q_smem, k_ring, v_ring, ones_smem, k_ready, v_ready, k_empty, v_empty,
     o_ptr, lse_ptr, stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
     b, kvh, pid, L, qk_scale, n_total) = args
    MMA: gl.constexpr = base.mma_layout(4, BLOCK_N)
    MMA_L: gl.constexpr = base.mma_layout(4, L_COLS)
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    P_OP_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_L, k_width=2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA_L)

    row0 = (2 * pid + WHICH) * BLOCK_M
    n_full = (row0 // G + 1) // BLOCK_N  # blocks every row of the tile sees whole (rows past L mask nothing)
    o_i = row0 + gl.arange(0, BLOCK_M, layout=ROW)
    q_pos = o_i // G
    m_t = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW)  # the running total and the chunk's state:
    l_t = gl.zeros([BLOCK_M, L_COLS], gl.float32, layout=MMA_L)  # both the empty state
    acc_t = gl.zeros([BLOCK_M, D], gl.float32, layout=MMA)
    m_i, l_i, acc = m_t, l_t, acc_t
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=MMA)
    q_tile = q_smem.index(WHICH)
    for j in range(0, n_total):
        slot = j % 2
        phase = (j // 2) & 1
        k_smem = k_ring.index(slot)
        v_smem = v_ring.index(slot)
        mbarrier.wait(k_ready.index(slot), phase)
        s = warpgroup_mma(q_tile, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, k_smem))
        gl.thread_barrier()  # every warp of this warpgroup past its wait (a named barrier of the partition's own)
        mbarrier.arrive(k_empty.index(slot), count=1)  # one arrival a warpgroup: the slot's K is free for this one
        k_pos = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=COL)
        keep = (gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos, 1)) & gl.expand_dims(k_pos < L, 0)
        mbarrier.wait(v_ready.index(slot), phase)
        m_i, l_i, acc = base._block(s, keep, j >= n_full, m_i, l_i, acc, v_smem, ones_smem, qk_scale, P_OP, P_OP_L,
                                    ROW_L)
        gl.thread_barrier()
        mbarrier.arrive(v_empty.index(slot), count=1)
        m_t, l_t, acc_t, m_i, l_i, acc = base._chunk_end(j, CHUNK, m_t, l_t, acc_t, m_i, l_i, acc, ROW_L)
    m_t, l_t, acc_t = base._fold(m_t, l_t, acc_t, m_i, l_i, acc, ROW_L)
    base._store(o_ptr, lse_ptr, m_t, l_t, acc_t, b, kvh, o_i, b * 0, L, stride_ob, stride_oh, stride_os, stride_lb,
                stride_lh, stride_ls, G, D, ROW, COL)


@gluon.jit
def _producer(args, G: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CHUNK: gl.constexpr, L_COLS: gl.constexpr, WHICH: gl.constexpr):
    """Streams blocks 0 ... n_total - 1 of K and V into the ring, each slot once both consumers are done with it."""
    (q_smem, k_ring, v_ring, ones_smem, k_ready, v_ready, k_empty, v_empty,
     k_desc, v_desc, k_row, k_col, v_row, v_col, n_total) = args
    for j in range(0, n_total):
        slot = j % 2
        phase = (j // 2) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)  # a fresh barrier's phase 1 counts as complete
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [k_row + j * BLOCK_N, k_col], k_ready.index(slot), k_ring.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [v_row + j * BLOCK_N, v_col], v_ready.index(slot), v_ring.index(slot))


@gluon.jit
def _attn_fwd_ws_kernel(
    q_ptr, o_ptr, lse_ptr, k_desc, v_desc,
    k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    stride_qb, stride_qh, stride_qs,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_ls,
    L, n_kv_heads, qk_scale,
    G: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNK: gl.constexpr,
    L_COLS: gl.constexpr,
):
    LOAD: gl.constexpr = base.load_layout(4)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.bfloat16)
    ONES_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, L_COLS], gl.bfloat16)
    pid = gl.program_id(0)
    pid_bh = gl.program_id(1).to(gl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    if 2 * pid * BLOCK_M >= L * G:
        return

    # both tiles' Q (through pointers: its rows interleave the group's heads) and the ones, by the default warps
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, D], Q_SMEM)
    for t in gl.static_range(2):
        lo_i = (2 * pid + t) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LOAD))
        lq_pos = lo_i // G
        p_q = (q_ptr + b * stride_qb + gl.expand_dims((kvh * G + lo_i % G) * stride_qh + lq_pos * stride_qs, 1)
               + gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, LOAD)), 0))
        q_smem.index(t).store(gl.load(p_q, mask=gl.expand_dims(lq_pos < L, 1), other=0.0))
    ones_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, L_COLS], ONES_SMEM,
                                          gl.full([BLOCK_N, L_COLS], 1.0, gl.bfloat16, layout=LOAD))
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D], k_desc.layout)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D], v_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for r in gl.static_range(2):
        mbarrier.init(k_ready.index(r), count=1)
        mbarrier.init(v_ready.index(r), count=1)
        mbarrier.init(k_empty.index(r), count=2)  # both consumers
        mbarrier.init(v_empty.index(r), count=2)
    fence_async_shared()
    gl.thread_barrier()

    # the blocks the longer walk (the second tile's, or the first's where the second is past the end) needs
    last_row = gl.minimum((2 * pid + 2) * BLOCK_M, L * G) - 1
    n_total = gl.cdiv(last_row // G + 1, BLOCK_N)
    k_row = (b * k_rb + kvh * k_rh).to(gl.int32)
    v_row = (b * v_rb + kvh * v_rh).to(gl.int32)
    k_col = (kvh * k_ch).to(gl.int32)
    v_col = (kvh * v_ch).to(gl.int32)
    consumer_args = (q_smem, k_ring, v_ring, ones_smem, k_ready, v_ready, k_empty, v_empty,
                     o_ptr, lse_ptr, stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
                     b, kvh, pid, L, qk_scale, n_total)
    producer_args = (q_smem, k_ring, v_ring, ones_smem, k_ready, v_ready, k_empty, v_empty,
                     k_desc, v_desc, k_row, k_col, v_row, v_col, n_total)
    gl.warp_specialize([
        (_consumer, (consumer_args, G, D, BLOCK_M, BLOCK_N, CHUNK, L_COLS, 0)),
        (_consumer, (consumer_args, G, D, BLOCK_M, BLOCK_N, CHUNK, L_COLS, 1)),
        (_producer, (producer_args, G, D, BLOCK_M, BLOCK_N, CHUNK, L_COLS, 0)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def prefill_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
    """(o, lse) of causal GQA prefill, as `attention_gluon.prefill_forward` takes it, by the warp-specialized kernel."""
    kd, vd, o, lse, G, qk_scale = forms._prepare(q, k, v, scale)
    B, hk, S = q.shape[0], k.shape[1], q.shape[2]
    _attn_fwd_ws_kernel[(triton.cdiv(triton.cdiv(S * G, base.BLOCK_M), 2), B * hk)](
        q, o, lse, base._descriptor(k, kd), base._descriptor(v, vd), *kd[1], *vd[1],
        q.stride(0), q.stride(1), q.stride(2), o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2), S, hk, qk_scale,
        G=G, D=base.HEAD_DIM, BLOCK_M=base.BLOCK_M, BLOCK_N=base.BLOCK_N, CHUNK=base.CHUNK_BLOCKS, L_COLS=base.L_COLS,
        num_warps=4, enable_fp_fusion=False,
    )
    return o, lse
