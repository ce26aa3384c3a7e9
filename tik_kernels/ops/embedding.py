"""Token embedding, batch-invariant: `embedding(ids[T], table[V, H]) -> table[ids]` of shape [T, H].

Forward is a gather: each output row is a bit-exact copy of its table row (no arithmetic, no dtype
change), so it cannot depend on T, order or packing. Ids outside [0, V) give a zero row (no host sync to
check them).

Backward (table gradient) is deterministic without atomics: the ids are sorted stably (equal ids keep
token order), each run of equal ids is one segment, and the program that owns a segment's first
position sums the segment's upstream-gradient rows in that order in fp32 and writes its table row once
(rounded to the table's dtype). Rows no token uses stay zero. Segment lengths come from torch ops on the
device (no host sync). A very long segment (thousands of copies of one id, e.g. padding) is summed by one
program, serially: correct and deterministic, but slow — pack sequences instead of padding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels.ops._common import round_to

#: a copy and a fixed-order segmented sum: no value here changes any bits
TUNABLES = {"BLOCK_T": (1, 2, 4, 8, 16), "BLOCK_H": (256, 512, 1024, 2048), "num_warps": (1, 2, 4, 8)}
CONFIG = {"BLOCK_T": 4, "BLOCK_H": 1024, "num_warps": 4}


@triton.jit
def _embedding_fwd_kernel(
    ids_ptr,  # [T] token ids
    table_ptr,  # [V, H] embedding table (row stride stride_v, unit column stride)
    y_ptr,  # [T, H] output, contiguous
    T,
    V,
    H,
    stride_v,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    o_t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    o_h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_t = o_t < T
    b_id = tl.load(ids_ptr + o_t, mask=m_t, other=0).to(tl.int64)  # [BT]
    m_id = m_t & (b_id >= 0) & (b_id < V)
    m_h = o_h < H
    b_row = tl.load(table_ptr + b_id[:, None] * stride_v + o_h[None, :], mask=m_id[:, None] & m_h[None, :],
                    other=0.0)  # [BT, BH], the table's dtype: copied, never converted
    tl.store(y_ptr + o_t[:, None] * H + o_h[None, :], b_row, mask=m_t[:, None] & m_h[None, :])


@triton.jit
def _embedding_bwd_kernel(
    sorted_ptr,  # [T] ids sorted stably
    order_ptr,  # [T] token index of each sorted position
    seg_len_ptr,  # [T] segment length at a segment's first position, 0 elsewhere
    g_ptr,  # [T, H] upstream gradient, contiguous
    dtable_ptr,  # [V, H] table gradient, zero-initialised, contiguous
    V,
    H,
    BLOCK_H: tl.constexpr,
):
    i_s = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    n = tl.load(seg_len_ptr + i_s)
    b_id = tl.load(sorted_ptr + i_s).to(tl.int64)
    b_acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    # the segment's rows in token order: one fixed summation order per table row
    for j in range(0, n):
        i_tok = tl.load(order_ptr + i_s + j).to(tl.int64)
        b_acc += tl.load(g_ptr + i_tok * H + o_h, mask=m_h, other=0.0).to(tl.float32)
    m_own = (tl.zeros([BLOCK_H], dtype=tl.int64) + n) > 0
    m_id = (tl.zeros([BLOCK_H], dtype=tl.int64) + b_id >= 0) & (tl.zeros([BLOCK_H], dtype=tl.int64) + b_id < V)
    tl.store(dtable_ptr + b_id * H + o_h, round_to(b_acc, dtable_ptr.dtype.element_ty), mask=m_h & m_own & m_id)


def embedding_fwd(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    if table.dim() != 2 or table.stride(-1) != 1:
        raise ValueError(f"embedding: table must be [V, H] with contiguous rows, got {tuple(table.shape)}")
    V, H = table.shape
    flat = ids.reshape(-1).contiguous()
    T = flat.numel()
    y = torch.empty((T, H), dtype=table.dtype, device=table.device)
    if T:
        grid = (triton.cdiv(T, CONFIG["BLOCK_T"]), triton.cdiv(H, CONFIG["BLOCK_H"]))
        _embedding_fwd_kernel[grid](flat, table, y, T, V, H, table.stride(0), BLOCK_T=CONFIG["BLOCK_T"],
                                    BLOCK_H=CONFIG["BLOCK_H"], num_warps=CONFIG["num_warps"])
    return y.view(*ids.shape, H)


def embedding_bwd(g: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    H = g.shape[-1]
    flat = ids.reshape(-1)
    T = flat.numel()
    g2 = g.reshape(T, H).contiguous()
    dtable = torch.zeros((V, H), dtype=g.dtype, device=g.device)
    if T:
        srt, order = torch.sort(flat, stable=True)
        start = torch.ones(T, dtype=torch.bool, device=g.device)
        start[1:] = srt[1:] != srt[:-1]
        seg = torch.cumsum(start, 0) - 1
        # integer counts: exact whatever order they are accumulated in
        counts = torch.bincount(seg, minlength=T)
        seg_len = torch.where(start, counts[seg], torch.zeros_like(counts))
        grid = (T, triton.cdiv(H, CONFIG["BLOCK_H"]))
        _embedding_bwd_kernel[grid](srt.contiguous(), order.contiguous(), seg_len.contiguous(), g2, dtable, V, H,
                                    BLOCK_H=CONFIG["BLOCK_H"], num_warps=CONFIG["num_warps"])
    return dtable


class EmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.vocab = table.shape[0]
        return embedding_fwd(ids, table)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (ids,) = ctx.saved_tensors
        return None, embedding_bwd(g, ids, ctx.vocab)


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """table[ids]: ids of any shape (int32/int64), table [V, H]; returns [*ids.shape, H] in the table's dtype."""
    return EmbeddingFunction.apply(ids, table)
