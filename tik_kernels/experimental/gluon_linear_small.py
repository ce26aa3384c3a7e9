"""The linear root's small-batch product (M <= 16 rows) written in Gluon: an experiment, not a root.

Why. Decode-size linear streams the weight once; on an H100 the root reaches 2.1-3.1 TB/s there and takes 0.94-1.05x
cuBLAS's time (issue #16 asks 0.95x over the M <= 16 cells). Its M16 launch is a 16-row tile of 64 weight rows
(Triton's mma.sync for 16 rows) with four pipelined stages. Here the product is computed transposed, out^T = W x^T
("swap AB"): 64 weight rows are the rows of a Hopper warpgroup MMA (wgmma's smallest M) and the (at most 16) tokens its
columns, so the weight tile goes from shared memory straight into the MMA and a ring of STAGES weight tiles (8 KB each)
fed by the tensor-memory accelerator keeps that many loads in flight a program, each slot refilled as soon as the MMA
that read it is done. `swap=False` keeps the root's orientation instead (out = x W^T, x padded to 64 rows by the TMA's
zero fill, the rows of the MMA the root's larger-M launches use), for the case where swapping the operands' roles
moves bits: four times the MMA work, which a product this memory-bound does not notice.

What must hold: the root's tree (`tik_kernels.ops.linear`'s docstring), so the root's bits. K in chunks of
`linear._kchunk(N)` (2048; 1024 for an output of at most 2048 columns); each chunk summed K-sequentially from a fresh
fp32 accumulator, 16 products an MMA step in K order, as the root's BLOCK_K = 64 dots are; chunk sums added left to
right from 0 in fp32, ((0 + s_0) + s_1) + ..., rounded to bf16 once. A program computes one (64 weight rows, chunk)
pair; with more than one chunk it writes its chunk sum (fp32) to a workspace and the last program of its 64 rows to
arrive (an arrival counter, reset by that program) adds them in chunk order, as the root's fused combine does. Whether
an MMA with the operands' roles swapped gives each output element the root's bits is the GPU's to say:
`tests/kernels/test_gluon_linear_small.py` compares both orientations with the root at M = 1, 4, 16.

Scope: bf16 x [M, K] (M <= 16) and w [N, K], both with unit stride along K and 16-byte aligned rows (TMA). It needs a
Hopper GPU and Gluon (Triton 3.6 on the GPU machine); nothing imports this module unless a GPU test or benchmark asks.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tik_kernels.ops import linear as root
from tik_kernels.ops._common import pdl_launch

#: weight rows a program (wgmma's M for one warpgroup), K a step (the root's BLOCK_K), tokens padded to (wgmma's N)
BLOCK_N = 64
BLOCK_K = 64
M_PAD = 16
#: rows of x the unswapped form pads to (wgmma's smallest M): it takes up to this many tokens
X_ROWS_UNSWAPPED = 64
STAGES = 8


@gluon.jit
def _linear_small_kernel(
    w_desc,  # [N, K] tiles of [BLOCK_N, BLOCK_K]
    x_desc,  # [M, K] tiles of [X_ROWS, BLOCK_K] (16 swapped, 64 not); rows past M read as zeros
    c_ptr,  # [M, N] output, bf16
    ws_ptr,  # [n_chunks, M, N] fp32 chunk sums (more than one chunk only)
    cnt_ptr,  # [programs along axis 0] int32 arrivals, zero between launches
    M, N, K,
    stride_cm, stride_cn,
    n_chunks,
    KCHUNK: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr,
    SWAP: gl.constexpr = True,  # out^T = W x^T (weight rows as the MMA's rows); False: out = x W^T, x padded to 64 rows
    PDL: gl.constexpr = False,
):
    X_ROWS: gl.constexpr = x_desc.block_type.shape[0]
    if SWAP:  # the accumulator is [weight rows, tokens]
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, X_ROWS, 16])
        ACC_SHAPE: gl.constexpr = [BLOCK_N, X_ROWS]
    else:  # [tokens (padded to 64 rows: wgmma's smallest M), weight rows]
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        ACC_SHAPE: gl.constexpr = [X_ROWS, BLOCK_N]
    ROW_AX: gl.constexpr = gl.SliceLayout(1, MMA)
    COL_AX: gl.constexpr = gl.SliceLayout(0, MMA)
    pid_n = gl.program_id(0)
    pid_c = gl.program_id(1)

    w_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, X_ROWS, BLOCK_K], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for r in gl.static_range(STAGES):
        mbarrier.init(bars.index(r), count=1)
    if PDL:  # the kernel before on the stream complete (its writes seen) before any read; then let the next launch
        gdc_wait()
        gdc_launch_dependents()

    n0 = pid_n * BLOCK_N
    k0 = pid_c * KCHUNK
    steps = gl.cdiv(gl.minimum(K - k0, KCHUNK), BLOCK_K)
    nbytes: gl.constexpr = w_desc.block_type.nbytes + x_desc.block_type.nbytes
    for r in gl.static_range(STAGES - 1):  # the ring's first loads
        go = r < steps
        mbarrier.expect(bars.index(r), nbytes, pred=go)
        tma.async_copy_global_to_shared(w_desc, [n0, k0 + r * BLOCK_K], bars.index(r), w_smem.index(r), pred=go)
        tma.async_copy_global_to_shared(x_desc, [0, k0 + r * BLOCK_K], bars.index(r), x_smem.index(r), pred=go)

    acc = gl.zeros(ACC_SHAPE, gl.float32, layout=MMA)
    for i in range(0, steps):
        slot = i % STAGES
        mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
        # the chunk's sum from a fresh accumulator: its first step ignores it (the root's reset)
        if SWAP:
            acc = warpgroup_mma(w_smem.index(slot), x_smem.index(slot).permute((1, 0)), acc, use_acc=i > 0,
                                is_async=True)
        else:
            acc = warpgroup_mma(x_smem.index(slot), w_smem.index(slot).permute((1, 0)), acc, use_acc=i > 0,
                                is_async=True)
        # the step before is done with its slot once every warp has seen it done: refill it with the step
        # STAGES - 1 ahead
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_smem, x_smem))
        gl.thread_barrier()
        nxt = i + STAGES - 1
        sn = nxt % STAGES
        go = nxt < steps
        mbarrier.expect(bars.index(sn), nbytes, pred=go)
        tma.async_copy_global_to_shared(w_desc, [n0, k0 + nxt * BLOCK_K], bars.index(sn), w_smem.index(sn), pred=go)
        tma.async_copy_global_to_shared(x_desc, [0, k0 + nxt * BLOCK_K], bars.index(sn), x_smem.index(sn), pred=go)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for r in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(r))

    if SWAP:
        o_n = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=ROW_AX), 1)
        o_m = gl.expand_dims(gl.arange(0, X_ROWS, layout=COL_AX), 0)
    else:
        o_m = gl.expand_dims(gl.arange(0, X_ROWS, layout=ROW_AX), 1)
        o_n = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=COL_AX), 0)
    m_c = (o_n < N) & (o_m < M)
    p_c = c_ptr + o_m * stride_cm + o_n * stride_cn
    if n_chunks == 1:
        # the walking program's total: 0 + the one chunk's sum, rounded once
        total = gl.zeros(ACC_SHAPE, gl.float32, layout=MMA) + acc
        gl.store(p_c, total.to(gl.bfloat16), mask=m_c)
    else:
        p_ws = ws_ptr + o_m.to(gl.int64) * N + o_n
        gl.store(p_ws + pid_c.to(gl.int64) * M * N, acc, mask=m_c)
        # every thread's chunk sum written before one thread announces it (release at GPU scope)
        gl.thread_barrier()
        arrived = gl.atomic_add(cnt_ptr + pid_n, 1)
        if arrived == n_chunks - 1:
            total = gl.zeros(ACC_SHAPE, gl.float32, layout=MMA)
            for c in range(0, n_chunks):  # the one merge order: chunk c added to the sum of chunks 0 .. c-1
                total = total + gl.load(p_ws + c * M * N, mask=m_c, other=0.0, cache_modifier=".cg")
            gl.store(p_c, total.to(gl.bfloat16), mask=m_c)
            gl.atomic_xchg(cnt_ptr + pid_n, 0)


def linear_small(x: torch.Tensor, w: torch.Tensor, stages: int | None = None, pdl: bool = True,
                 swap: bool = True) -> torch.Tensor:
    """x[M, K] @ w[N, K].T -> [M, N] bf16 on a Hopper GPU, the root's tree. swap (M <= 16): out^T = W x^T, the
    weight's rows as the MMA's rows and a ring of 8 by default; False (M <= 64, a decode batch of 64 too): x padded
    (by the TMA's zero fill) to 64 rows as the MMA's rows, the root's own orientation, a ring of 6 (its x tiles are
    4 times larger). Raises ValueError where it does not apply."""
    M, K = x.shape
    N = w.shape[0]
    x_rows = M_PAD if swap else X_ROWS_UNSWAPPED
    if not 1 <= M <= x_rows or w.shape[1] != K or x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        raise ValueError(f"linear_small takes bf16 x [M <= {x_rows}, K] and w [N, K], got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}")
    if x.stride(1) != 1 or w.stride(1) != 1 or (x.stride(0) * 2) % 16 or (w.stride(0) * 2) % 16:
        raise ValueError("linear_small reads x and w through TMA: unit stride along K, 16-byte aligned rows")
    kchunk = root._kchunk(N)
    n_chunks = triton.cdiv(K, kchunk)
    tiles = triton.cdiv(N, BLOCK_N)
    c = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    # the root's workspace and counters: a one-chunk launch touches neither; counters are left zero by every launch
    ws = torch.empty((n_chunks, M, N), device=x.device, dtype=torch.float32) if n_chunks > 1 else root._dummy(x.device)
    cnt = root._counters(x.device, tiles)
    w_desc = TensorDescriptor(w, [N, K], [w.stride(0), 1], [BLOCK_N, BLOCK_K],
                              gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.bfloat16))
    x_desc = TensorDescriptor(x, [M, K], [x.stride(0), 1], [x_rows, BLOCK_K],
                              gl.NVMMASharedLayout.get_default_for([x_rows, BLOCK_K], gl.bfloat16))
    _linear_small_kernel[(tiles, n_chunks)](
        w_desc, x_desc, c, ws, cnt, M, N, K, c.stride(0), c.stride(1), n_chunks,
        KCHUNK=kchunk, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, STAGES=stages or (STAGES if swap else 6), SWAP=swap,
        num_warps=4, enable_fp_fusion=False, **pdl_launch(pdl, x.device),
    )
    return c
