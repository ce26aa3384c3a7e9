"""Unified causal GQA attention: prefill, packed (varlen) training forward and KV-cache decode, bitwise equal.

The reduction over keys is a fixed tree; how it is spread over programs is free.

* Keys are walked in KV blocks of `BLOCK_N` keys aligned to the absolute key position in the sequence (block j
  holds keys j*BLOCK_N ... j*BLOCK_N + BLOCK_N - 1), and blocks are grouped into chunks of `CHUNK_BLOCKS`
  blocks, also by absolute position (chunk c holds blocks c*CHUNK_BLOCKS ... c*CHUNK_BLOCKS + CHUNK_BLOCKS - 1;
  on the GPU 4 x 128 = 512 keys). Neither size ever depends on the regime, the batch, the length or the position.
* A chunk's online-softmax state (running max m, denominator l, numerator acc, all fp32) starts fresh
  (m = -inf, l = acc = 0) and runs over the chunk's blocks in order, each block through one shared step,
  `_softmax_step`: raw fp32 scores s = q.k (one `tl.dot`, K = D), s * qk_scale, mask to -inf, running max
  (order-free), alpha = exp2(m_old - m_new), p = exp2(s - m_new) rounded to the input dtype, then
  `l = dot(p, ones, l * alpha)` and `acc = dot(p, v, acc * alpha)`. A row that has seen no key of the chunk yet
  keeps m = -inf and subtracts 0 instead, so its l and acc stay exactly 0 (never NaN).
* Chunk states merge into a running total in one fixed sequential order, chunk 0, then 1, then 2 ..., starting
  from the empty state, with one formula everywhere (`_merge`, `_merge_sum`): m = max(m_a, m_b),
  l = l_a * exp2(m_a - m) + l_b * exp2(m_b - m), acc likewise; then out = acc / l (and, for the backward,
  lse = m + log2(l)). Merging the empty state, or the first chunk into it, is exact (x * 1 + 0 * 0 = x).
* The only order-sensitive sums over keys are `tl.dot`s of the same K (= BLOCK_N) and the merge's additions, so
  no row reduction depends on the register layout of a kernel (a `tl.sum` would: its tree follows the layout);
  the softmax denominator is a dot with a ones matrix, not a `tl.sum`. fp contraction is off for every launch
  (`enable_fp_fusion=False`), so no multiply-add is fused into an FMA in one kernel and not in another.
* Keys in a row's future and masked keys contribute exactly nothing: inside a chunk a fully masked block leaves
  the state unchanged (alpha == 1, p == 0), and a chunk wholly in a row's future is the empty state, whose merge
  is the identity. So a prefill tile may walk past a row's diagonal, and garbage (even NaN) past a cache's
  length never leaks in: the row at position t gets chunks 0 ... t // CHUNK_KEYS, the last one partial (keys up to
  t), exactly what decode at position t computes.

Where the tree is evaluated (free, changes no bits):
* prefill (`attention_prefill`, `attention_varlen` for packed sequences): one fused kernel; a program owns
  BLOCK_M query rows of one KV-head group (rows enumerate (position, head-in-group) pairs, so the GQA heads that
  share a KV head share its loads), walks blocks 0 ... its diagonal and merges at chunk boundaries itself;
* decode (`attention_decode`): one query per sequence, so the chunks run in parallel: a program computes
  DECODE_CHUNKS_PER_PROG chunks for one (sequence, KV head) with the group's query heads as rows (the KV is read
  once), writing each chunk's fp32 state to a workspace; the states are merged in chunk order and normalized by
  a combine kernel or, with DECODE_FUSED_MAX_CHUNKS, by the last of the pair's programs to finish (an arrival
  counter per pair, reset by that program: one launch instead of two, the same merge code). From
  DECODE_FOLD_GROUPS (sequence, KV head) pairs on, or when the cache holds a single chunk, there
  are enough programs without splitting: one program per pair walks every chunk and merges in-program, as
  prefill does, with no workspace and no second launch.

What must never vary (frozen in the contract): BLOCK_N, CHUNK_BLOCKS, the step's operations, the merge formula
and order, exp2 with the log2(e)-folded scale, p rounded to the input dtype before both dots, fp32 states.
BLOCK_M, warps, stages, chunks per program and the split choice change only which rows and chunks share a
program; on an H200 the MMA bits of a row do not depend on the tile's other rows, and the contract's root_bits
check re-proves it for every candidate. The order programs are launched in (FWD_LONGEST_FIRST, DQ_LONGEST_FIRST:
the causal walks grow with the row tile, so the last tiles may go first) and whether K and V arrive through TMA
descriptors or pointers are free too, and so is which kernel computes the forward: on a Hopper GPU the Triton
kernel's tree in Gluon (`ops/attention_gluon.py`, FWD_GLUON), whose loads of the next K and V block start as soon
as the current block's products have read the buffers.

KV cache: `k_cache[B, Hk, L, D]` with `lens[B]` valid keys per sequence (the current token's k/v already written
at `lens[b] - 1`); an engine allocates L once and writes position `lens[b]` in place, any strides allowed.

Backward (prefill and varlen), deterministic, no floating-point atomics: with delta = rowsum(o * dO) and the
forward's lse, p = exp2(s * qk_scale - lse); a dq kernel (one program per query tile, walking KV blocks of
DQ_BLOCK_N keys from 0 up) and a dk/dv kernel (one program per KV block, walking the group's query rows in tiles of
DKDV_BLOCK_M from the last down to the first that sees the block). The sizes that set a sum's order (DQ_BLOCK_N,
DKDV_BLOCK_M) and the walks' directions are frozen; the other tile of each kernel is free. Blocks a row cannot
see add exact zeros, so each kernel may skip them.

BWD_DS_STORE = 1 (the root's choice) keeps that tree and drops the dq kernel's recompute. The dq kernel would
compute Q K^T, dO V^T and exp again for every (row tile, KV block) only to form dS, which the dk/dv kernel already
has (transposed, from K Q^T): three MMAs per step where one is the sum itself. So the dk/dv kernel stores dS,
rounded to the input dtype exactly as the dq kernel rounds it, into a workspace, and `_attn_bwd_dq_ds_kernel` adds
dot(dS_j, K_j, acc) over blocks j = 0, 1, 2 ... of DQ_BLOCK_N keys: the dq kernel's chain on the same operands, one
MMA per step. The workspace holds only the causal half: row tile t of DKDV_BLOCK_M rows keeps its blocks 0 ... the
one holding its last position, one after another, and the tiles follow each other, so a dq program streams
contiguous memory (a first layout, one slab of rows per key block, measured the same at S = 4k; at 16k it was only
timed with one KV head per launch, which no layout makes fast). Whether dS from K Q^T gives the MMA the bits of dS
from Q K^T is the GPU's to say: on the H200 it does at every shape tried (tests/kernels/test_attention_ds.py, the
contract's root_bits), so the root's gradients are the dq kernel's to the bit. The workspace takes B * Hq * S^2 / 2
entries (1.07 GB per KV head of 4 query heads at S = 16k); past DS_STORE_MAX_BYTES (8 GiB, at most an eighth of the
GPU's memory; TIK_ATTN_DS_MAX_BYTES overrides; a workspace the allocator cannot give now means the dq kernel) the KV
heads go in groups, and where one head does not fit, or a dk/dv launch would have fewer than DS_MIN_PROGRAMS
programs (every program's causal walk is as long as the longest: fewer than about two per SM leave SMs idle behind
the longest), the dq kernel computes dq. On the H200 forward + backward takes 0.81-1.02x SDPA flash at S = 1k (8
sequences) to 16k where the dq kernel's path took 1.16-1.43x (benchmarks/results/speed_h200_prefill_fwdbwd.md; the
knobs and budgets in attn_bwd_h200_ds.md).

BWD_DQ_FUSED = 1 drops the dq kernel: the dk/dv kernel already has dS for every (row tile, KV block) pair it
visits (transposed, from S^T = K Q^T), so it also adds dS @ K into an fp32 dq workspace laid out like q. The
order stays the dq kernel's chain: a row tile's sum is dot(dS_j, K_j, acc) for KV blocks of DQ_BLOCK_N keys,
j = 0, 1, 2 ... (a key tile of 2 * DQ_BLOCK_N is two chained dots). A per-(sequence, KV head, row tile) counter
holds how many blocks the tile has; the program for block j waits (acquire) until it reads j, loads, adds, stores
and hands on j + 1 (release); program ids come from an atomic ticket, so block j - 1's program is running (or
done) whenever block j's waits, and the wait always ends. Every row tile is visited by blocks 0 ... its last (the
dk/dv walk of block j covers every row tile that sees it), so the sum is the dq kernel's whatever the scheduling.
The walk runs from the last row tile down, which makes the hand-over a wavefront: every program starts at the
last tile, block j reaches each tile one step after block j - 1 left it, and block j - 1 is always ahead (a walk
from the diagonal up would reach tile i first from the block nearest to it and queue every tile's blocks behind
block 0, the last to arrive: 2.5-3.3x SDPA flash that way at S = 4k-16k, 1.95-3.07x with the wavefront, where the
two kernels take 1.42-1.44x: the hand-over itself, a fp32 tile read and written per row tile and block, is the cost
left; benchmarks/results/attn_bwd_h200_fused_all.md); a finishing
pass scales by sm_scale and rounds to q's dtype as the dq kernel does. Frozen with it: DQ_BLOCK_N, DKDV_BLOCK_M
and the order; whether the MMA gives dS @ K the same bits from dS computed transposed is the GPU's to say (the
contract's root_bits check decides, tests/kernels/test_attention_bwd.py reports it).
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET
from tik_kernels.ops._common import maxnreg_launch, pdl_launch, pdl_start

try:  # Triton >= 3.4: operands described for the tensor-memory accelerator (TMA)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton reads through pointers
    TensorDescriptor = None

TUNABLES = {
    # the KV block and the chunk (in blocks): they set the reduction tree over keys (frozen)
    "BLOCK_N": (128,),
    "CHUNK_BLOCKS": (4,),
    # the same on the CPU interpreter, smaller so that tiny test shapes span several chunks (frozen)
    "BLOCK_N_INTERPRET": (4,),
    "CHUNK_BLOCKS_INTERPRET": (2,),
    # prefill's row tile, warps and stages (who computes which rows: no bits). The CONFIG's 64 rows of 4 warps and
    # 1 stage with FWD_ONE_LOOP: H100, bench_speed's seven prefill cells, geomean 0.937 of SDPA flash against 0.998
    # for session 27's 128 rows of 8 warps and 2 stages with two loops in the same run, every cell faster
    # (results/speed_h100_prefill_variants_s28_m64.md); forward + backward 0.970 against 0.981
    # (results/speed_h100_fwdbwd_variants_s28_m64.md)
    "BLOCK_M": (64, 128),
    "num_warps": (4, 8),
    # 3 stages of 128 x 128 K and V tiles need more shared memory than an H200 has (233472 > 232448 bytes)
    "num_stages": (1, 2),
    # 1: prefill keeps the running total's acc in an fp32 scratch tile per program instead of registers (the same
    # operations on the same values; fewer registers, more L2 traffic at chunk edges)
    "FWD_TOTAL_IN_MEMORY": (0, 1),
    # 1: prefill reads the K and V blocks every row of its tile sees (the unmasked walk) through TMA descriptors
    # instead of pointer tensors: the same values into the same dots, no per-thread addresses held in registers
    "FWD_TMA": (0, 1),
    # 1: prefill's row tiles launched last first (the longest causal walks first, the shortest fill the end)
    "FWD_LONGEST_FIRST": (0, 1),
    # 1: prefill walks the causally masked (diagonal) blocks that lie wholly inside the sequence in the same loop as
    # the unmasked ones (TMA loads, pipelined into the last unmasked block's compute), masking them behind a branch;
    # only a block crossing the sequence's end stays in the separate masked loop. The same values, the same
    # operations (`_attn_fwd_kernel`). On by default: H100, bench_speed's seven prefill cells in one run, geomean
    # 0.971 of SDPA flash against 0.991 with the two loops (1.048 -> 1.012 at B=1 S=1024, 1.185 -> 1.120 at B=16
    # S=1024; 0.890 -> 0.899 at B=1 S=16384), results/speed_h100_prefill_variants_s28.json
    "FWD_ONE_LOOP": (0, 1),
    # 1: on a Hopper GPU with Triton's Gluon, the bf16 head-dim-128 forward (dense; packed with FWD_GLUON_VARLEN) is the
    # same tree in Gluon (ops/attention_gluon.py: each step sends for the next block's K and V as soon as this block's
    # products have read the buffers, which Triton's tl cannot say); the launch choices above then apply to the other
    # forwards only. Same bits (tests/kernels/test_gluon_attn_fwd.py). On by default: H100, seven prefill cells, geomean
    # 0.705 of SDPA flash against 0.919 for the Triton kernel in the same run (results/gluon_fwd_h100.md)
    "FWD_GLUON": (0, 1),
    # 1: with FWD_GLUON, packed (varlen) sequences too (each sequence's first row added to its rows' addresses, as
    # `_sequence` does). On by default: H100, bit tests green (results/pytest_gpu_h100_gluon_fwd_s42.log), bench_speed's
    # three varlen training cells 0.544-0.718 of flash-attn varlen against 0.605-0.791 for the Triton forward in the
    # same run (results/speed_h100_gluon_root_s42.md)
    "FWD_GLUON_VARLEN": (0, 1),
    # decode: rows of a program (the group's query heads, padded to an MMA's minimum)
    "DECODE_BLOCK_M": (16, 32, 64),
    "decode_num_warps": (2, 4, 8),
    "decode_num_stages": (1, 2, 3, 4),
    # decode over a cache of at most DECODE_SHORT_KEYS keys (a rollout's short contexts: each program walks a block or
    # two, so it has nothing to pipeline and one 8-warp, 3-stage program fills an SM's shared memory alone) launches
    # with these warps and stages instead; 0: never
    "DECODE_SHORT_KEYS": (0, 256, 512, 1024),
    "decode_short_num_warps": (2, 4, 8),
    "decode_short_num_stages": (1, 2, 3),
    # decode: a cap on the kernel's registers a thread (Triton's maxnreg; 0: the compiler's choice), long and short
    # caches: how many programs an SM holds at once, no bit changes. A qwen3-0.6b decode batch of 64 is 512 (sequence,
    # KV head) programs; the short launch (4 warps, 1 stage) compiles to 242 registers, two programs an SM, so they run
    # in two rounds on 132 SMs; capped at 128 four fit (every program at once) at 352/256 B of spills a thread, 8 warps
    # capped at 64 too at 264/204 B (sm_90, Triton 3.6's ptxas: results/attn_decode_regs_offline_s29.txt). Off until
    # a GPU times them (`gpu_pending.sh decode_regs`)
    "decode_maxnreg": (0, 64, 96, 128, 168),
    "decode_short_maxnreg": (0, 64, 96, 128, 168),
    # decode: chunks one split program computes (each chunk's state is written on its own)
    "DECODE_CHUNKS_PER_PROG": (1, 2, 4, 8),
    # decode: from this many (sequence, KV head) pairs on, no split: one program per pair merges in-program
    # (1073741824 = 2**30: never; written out, since the tuner reads TUNABLES as a literal)
    "DECODE_FOLD_GROUPS": (32, 64, 128, 256, 512, 1024, 2048, 1073741824),
    # decode, split: up to this many chunks in the cache (its capacity), the last program of a (sequence, KV head)
    # pair to finish merges the pair's chunk states itself; above it, and at 0, a combine kernel does
    "DECODE_FUSED_MAX_CHUNKS": (0, 2, 4, 8, 16, 64, 1073741824),
    # decode: its kernels launched with programmatic dependent launch (ops/_common.py): who runs when, no bit changes
    "DECODE_PDL": (0, 1),
    # combine: head-dim slice per program, chunk states loaded per step, warps
    "COMBINE_BLOCK_D": (16, 32, 64, 128),
    "COMBINE_CHUNKS": (2, 4, 8, 16),
    "combine_num_warps": (1, 2, 4),
    # backward: DQ_BLOCK_N and DKDV_BLOCK_M set the order of the dq and dk/dv sums (frozen with the gradient
    # bits); the query tile of the dq kernel and the key tile of the dk/dv kernel are free
    "DQ_BLOCK_N": (64,),
    "DKDV_BLOCK_M": (64,),
    "DQ_BLOCK_M": (64, 128),
    "DKDV_BLOCK_N": (64, 128),
    "bwd_num_warps": (4, 8),
    "bwd_num_stages": (1, 2, 3),
    # the dq kernel: keys per loop step (DQ_BLOCK_N or twice it: then two chained dots, the same sum), K and V of
    # its unmasked steps through TMA descriptors, and its own warps and stages (the dk/dv kernel keeps bwd_*)
    "DQ_TILE_N": (64, 128),
    "DQ_TMA": (0, 1),
    "dq_num_warps": (4, 8),
    "dq_num_stages": (1, 2, 3),
    # 1: the dq kernel's row tiles launched last first (as FWD_LONGEST_FIRST)
    "DQ_LONGEST_FIRST": (0, 1),
    # 1: the dk/dv kernel also computes dq (it has dS already), adding each row tile's KV blocks into an fp32
    # workspace one at a time in key order, 0, 1, 2 ..., so the sum is the dq kernel's chain; no dq kernel
    "BWD_DQ_FUSED": (0, 1),
    # 1: the dk/dv kernel stores dS (as the dq kernel rounds it) into a workspace and dq is one chain of dots of
    # the stored dS and K (the dq kernel's order, no recompute of Q K^T and dO V^T); where the workspace would pass
    # DS_STORE_MAX_BYTES the KV heads go in groups, and the dq kernel is used where one KV head would pass it
    "BWD_DS_STORE": (0, 1),
    # BWD_DS_STORE: the dk/dv kernel's key tile (DKDV_BLOCK_N is the two-kernel path's), the stored-dS dq kernel's
    # row tile (a multiple of DKDV_BLOCK_M), warps, stages and launch order
    "DS_DKDV_BLOCK_N": (64, 128),
    "DS_DQ_BLOCK_M": (64, 128),
    "ds_dq_num_warps": (4, 8),
    "ds_dq_num_stages": (2, 3, 4),
    "DS_LONGEST_FIRST": (0, 1),
    # BWD_DS_STORE: a launch of the dk/dv kernel with fewer programs than this keeps the dq kernel (each program's
    # causal walk is as long as the longest; with fewer than about two per SM the longest walks leave SMs idle)
    "DS_MIN_PROGRAMS": (0, 128, 256, 512),
}

#: keys only a path behind a gate reads ({key: {gate: values}}, a literal the tuner parses): the tuner spends no
#: evaluation on a move of one where its gate is off (the tuner's `live`); a two-key move can turn the gate on
#: with it
TUNABLE_WHEN = {
    "DS_DKDV_BLOCK_N": {"BWD_DS_STORE": (1,)},
    "DS_DQ_BLOCK_M": {"BWD_DS_STORE": (1,)},
    "ds_dq_num_warps": {"BWD_DS_STORE": (1,)},
    "ds_dq_num_stages": {"BWD_DS_STORE": (1,)},
    "DS_LONGEST_FIRST": {"BWD_DS_STORE": (1,)},
    "DS_MIN_PROGRAMS": {"BWD_DS_STORE": (1,)},
    "decode_short_num_warps": {"DECODE_SHORT_KEYS": (256, 512, 1024)},
    "decode_short_num_stages": {"DECODE_SHORT_KEYS": (256, 512, 1024)},
    "decode_short_maxnreg": {"DECODE_SHORT_KEYS": (256, 512, 1024)},
    "FWD_GLUON_VARLEN": {"FWD_GLUON": (1,)},
}

CONFIG = {
    "BLOCK_N": 128,
    "CHUNK_BLOCKS": 4,
    "BLOCK_N_INTERPRET": 4,
    "CHUNK_BLOCKS_INTERPRET": 2,
    "BLOCK_M": 64,
    "num_warps": 4,
    "num_stages": 1,
    "FWD_TOTAL_IN_MEMORY": 0,
    "FWD_TMA": 1,
    "FWD_LONGEST_FIRST": 0,
    "FWD_ONE_LOOP": 1,
    "FWD_GLUON": 1,
    "FWD_GLUON_VARLEN": 1,
    "DECODE_BLOCK_M": 16,
    "decode_num_warps": 8,
    "decode_num_stages": 3,
    "DECODE_CHUNKS_PER_PROG": 1,
    "DECODE_FOLD_GROUPS": 1024,
    "COMBINE_BLOCK_D": 32,
    "COMBINE_CHUNKS": 8,
    "combine_num_warps": 1,
    "DECODE_FUSED_MAX_CHUNKS": 8,
    "DECODE_PDL": 1,
    # H200, qwen3-0.6b decode, B = 64, a 256-key cache: 4 warps, 1 stage 23.6 us a layer against 26.6 with the
    # long-context launch (8, 3); decode_breakdown_h200_qwen3-0.6b_att_w4s1.md, _fill.md
    "DECODE_SHORT_KEYS": 512,
    "decode_short_num_warps": 4,
    "decode_short_num_stages": 1,
    "decode_maxnreg": 0,
    "decode_short_maxnreg": 0,
    "DQ_BLOCK_N": 64,
    "DKDV_BLOCK_M": 64,
    "DQ_BLOCK_M": 128,
    "DKDV_BLOCK_N": 64,
    "bwd_num_warps": 8,
    "bwd_num_stages": 2,
    "DQ_TILE_N": 64,
    "DQ_TMA": 0,
    "dq_num_warps": 8,
    "dq_num_stages": 2,
    "DQ_LONGEST_FIRST": 0,
    "BWD_DQ_FUSED": 0,
    "BWD_DS_STORE": 1,
    "DS_DKDV_BLOCK_N": 128,
    "DS_DQ_BLOCK_M": 64,
    "ds_dq_num_warps": 4,
    "ds_dq_num_stages": 3,
    "DS_LONGEST_FIRST": 1,
    "DS_MIN_PROGRAMS": 256,
}

#: BWD_DS_STORE: the most bytes its dS workspace may take (the causal half of dS in q's dtype: at S = 16k, 1.07 GB
#: per KV head of 4 query heads); KV heads are processed in groups that fit, and a backward whose single KV head
#: would not fit uses the dq kernel. At most an eighth of the GPU's memory; TIK_ATTN_DS_MAX_BYTES in the environment
#: sets it (0: never store dS)
DS_STORE_MAX_BYTES = 8 << 30

_LOG2E = 1.4426950408889634
#: columns of the ones matrix the softmax denominator is summed with (the smallest MMA N)
_L_COLS = 16


# ----------------------------------------------------------------------------- the reduction tree


@triton.jit
def _softmax_step(s, keep, m_i, l_i, acc, v, ones, qk_scale, P_TY: tl.constexpr, MASKED: tl.constexpr):
    """One KV block of a chunk's online softmax. Shared by every forward kernel: this is the order in a chunk."""
    s = s * qk_scale
    if MASKED:
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row with no key in the chunk so far: subtract 0, so alpha and p are exp2(-inf) = 0, not NaN
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_sub)
    p = tl.math.exp2(s - m_sub[:, None])
    # round p once; both the numerator and the denominator sum the same rounded weights
    p = p.to(P_TY).to(v.dtype)
    l_i = tl.dot(p, ones, l_i * alpha[:, None])
    acc = tl.dot(p, v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _merge(m_a, m_b):
    """Merging state b (the next chunk) into state a (the chunks before it): the new max and both rescales."""
    m = tl.maximum(m_a, m_b)
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.math.exp2(m_a - m_sub), tl.math.exp2(m_b - m_sub)


@triton.jit
def _merge_sum(x_a, alpha_a, x_b, alpha_b):
    """l or acc of a merge: two rounded products and one rounded sum (no FMA: fp fusion is off)."""
    return x_a * alpha_a + x_b * alpha_b


@triton.jit
def _total_start(t_ptr, pid_bh, pid_m, o_d, BLOCK_M: tl.constexpr, D: tl.constexpr, IN_MEMORY: tl.constexpr):
    """A prefill program's running total before its first chunk, the empty state: (m, l, acc, the scratch tile's
    pointers). IN_MEMORY: acc is the program's fp32 scratch tile (zeroed here; `_fold_chunk` reads and writes it),
    the returned acc a placeholder."""
    m_t = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_t = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    t_ptrs = t_ptr + (pid_bh * tl.num_programs(0) + pid_m) * (BLOCK_M * D) + tl.arange(0, BLOCK_M)[:, None] * D + o_d
    if IN_MEMORY:
        acc_t = tl.zeros([BLOCK_M, 16], dtype=tl.float32)  # unused: the total's acc is at t_ptrs
        tl.store(t_ptrs, tl.zeros([BLOCK_M, D], dtype=tl.float32))
    else:
        acc_t = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    return m_t, l_t, acc_t, t_ptrs


@triton.jit
def _fold_chunk(m_t, l_t, acc_t, m_i, l_i, acc, t_ptrs, IN_MEMORY: tl.constexpr):
    """Merge a finished chunk state into a program's running total. IN_MEMORY: the total's acc lives in an fp32
    scratch tile of the program's own (the same values and operations; registers hold one [rows, D] accumulator
    instead of two); a barrier orders one thread's store before another's load."""
    m_t, a_t, a_i = _merge(m_t, m_i)
    l_t = _merge_sum(l_t, a_t[:, None], l_i, a_i[:, None])
    if IN_MEMORY:
        tl.debug_barrier()
        tl.store(t_ptrs, _merge_sum(tl.load(t_ptrs), a_t[:, None], acc, a_i[:, None]))
    else:
        acc_t = _merge_sum(acc_t, a_t[:, None], acc, a_i[:, None])
    return m_t, l_t, acc_t


# ----------------------------------------------------------------------------- forward kernels


@triton.jit
def _sequence(cu_ptr, b, seq_len, VARLEN: tl.constexpr):
    """(batch index for the strides, first row, length) of sequence b: a packed sequence is rows cu[b] ...
    cu[b + 1] - 1 of batch 0, a dense one all seq_len rows of batch b."""
    if VARLEN:
        start = tl.load(cu_ptr + b).to(tl.int64)
        L = (tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b)).to(tl.int32)
        b = b * 0
    else:
        start = b * 0
        L = seq_len
    return b, start, L


@triton.jit
def _row_tile(LONGEST_FIRST: tl.constexpr):
    """The row tile of a causal walk this program computes. A row tile's walk grows with its index, so
    LONGEST_FIRST launches the last tiles first and leaves the short walks for the end of the launch (no bit
    changes: which program computes a tile is free)."""
    if LONGEST_FIRST:
        pid = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid = tl.program_id(0)
    return pid


@triton.jit
def _attn_fwd_kernel(
    q_ptr,  # [B, Hq, S, D] or packed [T, Hq, D]
    k_ptr,  # [B, Hk, S, D] or packed [T, Hk, D]
    v_ptr,  # like k
    o_ptr,  # like q
    lse_ptr,  # fp32 [B, Hq, S] or [T, Hq]: log2-domain log-sum-exp of each row, for the backward
    cu_ptr,  # int32 [B + 1] sequence starts (VARLEN only)
    t_ptr,  # fp32 scratch, a [BLOCK_M, D] tile per program (TOTAL_IN_MEMORY only)
    k_desc,  # TMA only: K as rows of positions; the block of (b, kvh, pos) at row b*k_rb + kvh*k_rh + start + pos,
    v_desc,  # column kvh*k_ch (`_kv_descriptor`); V likewise
    k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
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
    CHUNK: tl.constexpr,  # KV blocks per chunk
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
    TOTAL_IN_MEMORY: tl.constexpr,
    TMA: tl.constexpr = False,
    LONGEST_FIRST: tl.constexpr = False,  # row tiles launched last first (their walks are the longest)
    ONE_LOOP: tl.constexpr = False,  # diagonal blocks inside the sequence walked in the unmasked loop (FWD_ONE_LOOP)
):
    pid_m = _row_tile(LONGEST_FIRST)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    b, start, L = _sequence(cu_ptr, b, seq_len, VARLEN)
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

    # the running total (chunks merged so far) and the current chunk's state
    m_t, l_t, acc_t, t_ptrs = _total_start(t_ptr, pid_bh, pid_m, o_d, BLOCK_M, D, TOTAL_IN_MEMORY)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    ones = tl.full([BLOCK_N, 16], 1.0, dtype=b_q.dtype)

    # blocks visible to every row of the tile need no mask (a where() with an all-true mask is the identity)
    pos_lo = (pid_m * BLOCK_M) // G
    pos_hi = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, L)
    n_full = (pos_lo + 1) // BLOCK_N
    n_blocks = tl.cdiv(pos_hi, BLOCK_N)
    # the first loop's blocks: ONE_LOOP adds the diagonal ones wholly inside the sequence (they mask behind a branch)
    if ONE_LOOP:
        n_in = tl.minimum(n_blocks, L // BLOCK_N)
    else:
        n_in = n_full
    if TMA:
        k_row = (b * k_rb + kvh * k_rh + start).to(tl.int32)
        v_row = (b * v_rb + kvh * v_rh + start).to(tl.int32)
    for j in range(0, n_in):
        k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        if TMA:
            # whole blocks below L: never past the sequence, so never another sequence's (or poisoned) rows
            b_k = k_desc.load([k_row + j * BLOCK_N, (kvh * k_ch).to(tl.int32)])
            b_v = v_desc.load([v_row + j * BLOCK_N, (kvh * v_ch).to(tl.int32)])
        else:
            b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :])
            b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :])
        if UPCAST:
            b_k = b_k.to(tl.float32)
            b_v = b_v.to(tl.float32)
        s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN]
        if ONE_LOOP:
            if j >= n_full:
                # a diagonal block: masked before the scale, not after as the masked loop does (-inf * scale is
                # -inf, a kept score is scaled alike), so the same values
                s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
        m_i, l_i, acc = _softmax_step(s, s, m_i, l_i, acc, b_v, ones, qk_scale, P_TY, False)
        # the chunk is complete: merge it, start the next one fresh. Triton 3.6 leaves the PV dot in flight across the
        # loop's end, and this reset of its accumulator makes ptxas serialize the kernel's wgmmas (C7515, reported by
        # benchmarks/attn_ir_offline.py). Merging at the top of the next block instead (after its QK dot is waited
        # for) keeps them asynchronous, same bits, but timed 2% slower on an H100 (session 26,
        # results/speed_h100_prefill_fold_s26.md): the forward is not MMA-bound.
        if j % CHUNK == CHUNK - 1:
            m_t, l_t, acc_t = _fold_chunk(m_t, l_t, acc_t, m_i, l_i, acc, t_ptrs, TOTAL_IN_MEMORY)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for j in range(n_in, n_blocks):
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
        if j % CHUNK == CHUNK - 1:
            m_t, l_t, acc_t = _fold_chunk(m_t, l_t, acc_t, m_i, l_i, acc, t_ptrs, TOTAL_IN_MEMORY)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    # the last, partial chunk (the empty state if the walk ended on a chunk edge: then the merge is exact identity)
    m_t, l_t, acc_t = _fold_chunk(m_t, l_t, acc_t, m_i, l_i, acc, t_ptrs, TOTAL_IN_MEMORY)
    if TOTAL_IN_MEMORY:
        tl.debug_barrier()
        acc_t = tl.load(t_ptrs)

    l_row = tl.max(l_t, 1)
    out = acc_t / l_row[:, None]
    p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + (start + q_pos[:, None]) * stride_os + o_d[None, :]
    tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])
    p_l = lse_ptr + b * stride_lb + h * stride_lh + (start + q_pos) * stride_ls
    tl.store(p_l, m_t + tl.math.log2(l_row), mask=m_row)


@triton.jit
def _merge_chunk_states(wm_ptr, wl_ptr, w_base, a_base, stride_ac, n_chunks, m_row,
                        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr):
    """Every chunk state of one (sequence, KV head), rows h (w_base, a_base: their offsets), merged in chunk order
    0, 1, 2 ... and normalized: the fold prefill does at its chunk edges, with the same formula (`_merge`,
    `_merge_sum`) and the same division. The one place a split decode's merge is written (the combine kernel and
    the decode kernel's fused combine both call it). GROUP chunk states are loaded per step (their loads do not wait
    for the merges); a chunk past the sequence's last loads as the empty state, whose merge is the exact identity.
    .cg: states other programs of this launch wrote, never a stale L1 line."""
    o_g = tl.arange(0, BLOCK_G)
    m_t = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_t = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, n_chunks, GROUP):
        for i in tl.static_range(GROUP):
            c = c0 + i
            ok = m_row & ((o_g * 0 + c) < n_chunks)
            m_c = tl.load(wm_ptr + w_base + c, mask=ok, other=float("-inf"), cache_modifier=".cg")
            l_c = tl.load(wl_ptr + w_base + c, mask=ok, other=0.0, cache_modifier=".cg")
            acc_c = tl.load(a_base + c * stride_ac, mask=ok[:, None], other=0.0, cache_modifier=".cg")
            m_t, a_t, a_c = _merge(m_t, m_c)
            l_t = _merge_sum(l_t, a_t, l_c, a_c)
            acc_t = _merge_sum(acc_t, a_t[:, None], acc_c, a_c[:, None])
    return acc_t / l_t[:, None]


@triton.jit
def _attn_decode_kernel(
    q_ptr,  # [B, Hq, 1, D]
    k_ptr,  # k cache [B, Hk, L, D]
    v_ptr,  # v cache [B, Hk, L, D]
    o_ptr,  # [B, Hq, 1, D] (FOLD only)
    wm_ptr,  # fp32 [B, Hq, NC]: each chunk's m (split only)
    wl_ptr,  # fp32 [B, Hq, NC]: each chunk's l
    wa_ptr,  # fp32 [B, Hq, NC, D]: each chunk's acc
    lens_ptr,  # [B] valid keys per sequence
    cnt_ptr,  # int32 [B * Hk] arrivals per pair, zero between launches (FUSED only)
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh,
    stride_wb, stride_wh,  # of wm / wl (chunk stride 1)
    stride_ab, stride_ah, stride_ac,  # of wa (head-dim stride 1)
    n_kv_heads,
    qk_scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,
    CHUNKS_PER_PROG: tl.constexpr,
    FOLD: tl.constexpr,  # True: this program walks every chunk and merges them itself
    UPCAST: tl.constexpr,
    FUSED: tl.constexpr = False,  # split: the pair's last program to finish merges the chunk states
    GROUP: tl.constexpr = 8,  # FUSED: chunk states loaded per merge step
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_bh = tl.program_id(0).to(tl.int64)  # (sequence, KV head) pairs on the grid's large axis
    pid_c = tl.program_id(1)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    L = tl.load(lens_ptr + b).to(tl.int32)
    n_blocks = tl.cdiv(L, BLOCK_N)
    if FOLD:
        j0 = 0
        j1 = n_blocks
    else:
        j0 = pid_c * (CHUNKS_PER_PROG * CHUNK)
        j1 = tl.minimum(j0 + CHUNKS_PER_PROG * CHUNK, n_blocks)
    if j0 >= j1:
        return
    P_TY: tl.constexpr = v_ptr.dtype.element_ty
    o_g = tl.arange(0, BLOCK_M)
    m_row = o_g < G
    h = kvh * G + o_g
    o_d = tl.arange(0, D)
    b_q = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + o_d[None, :], mask=m_row[:, None], other=0.0)
    if UPCAST:
        b_q = b_q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh

    m_t = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_t = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    ones = tl.full([BLOCK_N, 16], 1.0, dtype=b_q.dtype)
    for j in range(j0, j1):
        k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        m_k = k_pos < L
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :], mask=m_k[:, None], other=0.0)
        b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :], mask=m_k[:, None], other=0.0)
        if UPCAST:
            b_k = b_k.to(tl.float32)
            b_v = b_v.to(tl.float32)
        s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN], the raw scores exactly as prefill computes them
        m_i, l_i, acc = _softmax_step(s, m_k[None, :], m_i, l_i, acc, b_v, ones, qk_scale, P_TY, True)
        if (j % CHUNK == CHUNK - 1) | (j == j1 - 1):  # a chunk ends (the sequence's last one may be partial)
            if FOLD:
                m_t, a_t, a_i = _merge(m_t, m_i)
                l_t = _merge_sum(l_t, a_t[:, None], l_i, a_i[:, None])
                acc_t = _merge_sum(acc_t, a_t[:, None], acc, a_i[:, None])
            else:
                c = j // CHUNK
                w_off = b * stride_wb + h * stride_wh + c
                tl.store(wm_ptr + w_off, m_i, mask=m_row)
                tl.store(wl_ptr + w_off, tl.max(l_i, 1), mask=m_row)
                p_a = wa_ptr + b * stride_ab + h[:, None] * stride_ah + c * stride_ac + o_d[None, :]
                tl.store(p_a, acc, mask=m_row[:, None])
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    if FOLD:
        out = acc_t / tl.max(l_t, 1)[:, None]
        p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + o_d[None, :]
        tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])
    elif FUSED:
        # the pair's programs with work are those whose first chunk starts before the sequence ends (the others
        # returned above); every thread's chunk states are written before one thread announces them
        n_chunks = tl.cdiv(n_blocks, CHUNK)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_bh, 1)
        if arrived == tl.cdiv(n_chunks, CHUNKS_PER_PROG) - 1:
            out = _merge_chunk_states(wm_ptr, wl_ptr, b * stride_wb + h * stride_wh,
                                      wa_ptr + b * stride_ab + h[:, None] * stride_ah + o_d[None, :], stride_ac,
                                      n_chunks, m_row, BLOCK_M, D, GROUP)
            p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + o_d[None, :]
            tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])
            tl.atomic_xchg(cnt_ptr + pid_bh, 0)


@triton.jit
def _attn_decode_combine_kernel(
    wm_ptr, wl_ptr, wa_ptr,  # chunk states from _attn_decode_kernel
    o_ptr,  # [B, Hq, 1, D]
    lens_ptr,
    stride_wb, stride_wh,
    stride_ab, stride_ah, stride_ac,
    stride_ob, stride_oh,
    n_kv_heads,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,  # next power of two of G
    BLOCK_D: tl.constexpr,
    CHUNK_KEYS: tl.constexpr,
    GROUP: tl.constexpr,  # chunk states loaded per step (their loads do not wait for the merges)
    PDL: tl.constexpr = False,
):
    """One (sequence, KV head)'s chunk states merged and normalized (`_merge_chunk_states`), a BLOCK_D slice of the
    head dim per program."""
    pdl_start(PDL)
    pid_bh = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    L = tl.load(lens_ptr + b).to(tl.int32)
    n_chunks = tl.cdiv(L, CHUNK_KEYS)
    o_g = tl.arange(0, BLOCK_G)
    m_row = o_g < G
    h = kvh * G + o_g
    o_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    out = _merge_chunk_states(wm_ptr, wl_ptr, b * stride_wb + h * stride_wh,
                              wa_ptr + b * stride_ab + h[:, None] * stride_ah + o_d[None, :], stride_ac, n_chunks,
                              m_row, BLOCK_G, BLOCK_D, GROUP)
    p_o = o_ptr + b * stride_ob + h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, out.to(o_ptr.dtype.element_ty), mask=m_row[:, None])


# ----------------------------------------------------------------------------- backward kernels


@triton.jit
def _attn_bwd_delta_kernel(
    o_ptr, do_ptr,  # like q
    delta_ptr,  # fp32, rows like lse
    cu_ptr,
    stride_qb, stride_qh, stride_qs,
    stride_lb, stride_lh, stride_ls,
    seq_len, n_heads,
    D: tl.constexpr,
    VARLEN: tl.constexpr,
):
    """delta = rowsum(o * dO) in fp32 for 16 positions of one head. The tile and warps are fixed (not tunables):
    a `tl.sum`'s tree follows the layout, and delta's bits are part of every gradient's."""
    pid_bh = tl.program_id(0).to(tl.int64)  # (sequence, head) pairs on the grid's large axis
    pid_s = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    b, start, L = _sequence(cu_ptr, b, seq_len, VARLEN)
    pos = pid_s * 16 + tl.arange(0, 16)
    m = pos < L
    off = b * stride_qb + h * stride_qh + (start + pos[:, None]) * stride_qs + tl.arange(0, D)[None, :]
    o = tl.load(o_ptr + off, mask=m[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + off, mask=m[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + b * stride_lb + h * stride_lh + (start + pos) * stride_ls, tl.sum(o * do, 1), mask=m)


@triton.jit
def _dq_dots(ds, b_k, acc, SUB: tl.constexpr):
    """acc += ds @ K over one key tile of SUB (= DQ_BLOCK_N) or 2 * SUB keys: one dot per SUB keys, chained in key
    order (the first half, then the second), so any key tile adds the dq kernel's terms in its order. The one place
    that order is written: the dq kernel and the fused dk/dv kernel both call it."""
    BN: tl.constexpr = ds.shape[1]
    if BN == SUB:
        acc = tl.dot(ds, b_k, acc)
    else:
        BM: tl.constexpr = ds.shape[0]
        D: tl.constexpr = b_k.shape[1]
        ds0, ds1 = tl.split(tl.permute(tl.reshape(ds, [BM, 2, SUB]), (0, 2, 1)))
        k0, k1 = tl.split(tl.permute(tl.reshape(b_k, [2, SUB, D]), (1, 2, 0)))
        acc = tl.dot(ds0, k0, acc)
        acc = tl.dot(ds1, k1, acc)
    return acc


@triton.jit
def _bwd_dq_block(b_q, b_do, b_lse, b_delta, dq, k_base, v_base, j, stride_ks, stride_vs, L, q_pos, o_d,
                  qk_scale, k_desc, v_desc, k_row, v_row, k_col, v_col, P_TY: tl.constexpr, BLOCK_N: tl.constexpr,
                  SUB: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr):
    """dq += dS @ K over one tile of BLOCK_N keys (MASKED: causal and length mask; else every key is visible to
    every row): one dot per SUB (= DQ_BLOCK_N) keys, chained in key order, so a tile of 2 * SUB keys adds the same
    terms in the same order as two tiles of SUB. TMA (unmasked tiles only): K and V through tensor descriptors."""
    k_pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
    m_k = k_pos < L
    if MASKED:
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :], mask=m_k[:, None], other=0.0)
        b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :], mask=m_k[:, None], other=0.0)
    elif TMA:
        # whole tiles below L: never past the sequence, so never another sequence's (or poisoned) rows
        b_k = k_desc.load([k_row + j * BLOCK_N, k_col])
        b_v = v_desc.load([v_row + j * BLOCK_N, v_col])
    else:
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :])
        b_v = tl.load(v_base + k_pos[:, None] * stride_vs + o_d[None, :])
    if UPCAST:
        b_k = b_k.to(tl.float32)
        b_v = b_v.to(tl.float32)
    s = tl.dot(b_q, tl.trans(b_k))
    p = tl.math.exp2(s * qk_scale - b_lse[:, None])
    if MASKED:
        keep = (k_pos[None, :] <= q_pos[:, None]) & m_k[None, :]
        p = tl.where(keep, p, 0.0)
    dp = tl.dot(b_do, tl.trans(b_v))
    ds = (p * (dp - b_delta[:, None])).to(P_TY).to(b_k.dtype)
    # keys a row cannot see add exact zeros
    return _dq_dots(ds, b_k, dq, SUB)


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr,
    do_ptr,  # like q
    dq_ptr,  # like q (contiguous in the same layout)
    lse_ptr, delta_ptr,  # fp32, rows like q
    cu_ptr,
    k_desc, v_desc,  # TMA only: as the forward's (`_kv_descriptor`), tiles of BLOCK_N keys
    k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_lb, stride_lh, stride_ls,
    seq_len, n_kv_heads, qk_scale, sm_scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys per loop step: SUB or 2 * SUB (free)
    SUB: tl.constexpr,  # keys per dot (DQ_BLOCK_N: sets the sum)
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr = False,
    LONGEST_FIRST: tl.constexpr = False,  # row tiles launched last first (their walks are the longest)
):
    """dq of BLOCK_M rows: KV blocks of SUB keys 0, 1, ... up to the tile's diagonal, in order (SUB sets the sum;
    a step of BLOCK_N = 2 * SUB keys does two of them)."""
    pid_m = _row_tile(LONGEST_FIRST)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    b, start, L = _sequence(cu_ptr, b, seq_len, VARLEN)
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
    # blocks of keys every row of the tile sees need no mask (rows past L are never stored)
    pos_lo = (pid_m * BLOCK_M) // G
    pos_hi = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, L)
    n_full = (pos_lo + 1) // BLOCK_N
    k_row = (b * k_rb + kvh * k_rh + start).to(tl.int32)
    v_row = (b * v_rb + kvh * v_rh + start).to(tl.int32)
    k_col = (kvh * k_ch).to(tl.int32)
    v_col = (kvh * v_ch).to(tl.int32)
    for j in range(0, n_full):
        dq = _bwd_dq_block(b_q, b_do, b_lse, b_delta, dq, k_base, v_base, j, stride_ks, stride_vs, L, q_pos, o_d,
                           qk_scale, k_desc, v_desc, k_row, v_row, k_col, v_col, P_TY, BLOCK_N, SUB, UPCAST, False,
                           TMA)
    for j in range(n_full, tl.cdiv(pos_hi, BLOCK_N)):
        dq = _bwd_dq_block(b_q, b_do, b_lse, b_delta, dq, k_base, v_base, j, stride_ks, stride_vs, L, q_pos, o_d,
                           qk_scale, k_desc, v_desc, k_row, v_row, k_col, v_col, P_TY, BLOCK_N, SUB, UPCAST, True,
                           False)
    dq = dq * sm_scale
    tl.store(dq_ptr + row_off, dq.to(dq_ptr.dtype.element_ty), mask=m_row[:, None])


@triton.jit
def _dq_ds_step(dq, k_base, rows, j, stride_ks, o_d, c, L, n_blk, m_row, TM: tl.constexpr, SUB: tl.constexpr,
                UPCAST: tl.constexpr, MASKED: tl.constexpr):
    """dq += stored dS block j @ K_j (MASKED: keys past L, rows past L and rows whose tile lacks block j are zeros;
    else every row sees every key of the block)."""
    if MASKED:
        k_pos = j * SUB + c
        m_k = k_pos < L
        b_k = tl.load(k_base + k_pos[:, None] * stride_ks + o_d[None, :], mask=m_k[:, None], other=0.0)
        ds = tl.load(rows[:, None] + j * (TM * SUB) + c[None, :],
                     mask=((j < n_blk) & m_row)[:, None] & m_k[None, :], other=0.0)
    else:
        b_k = tl.load(k_base + (j * SUB + c)[:, None] * stride_ks + o_d[None, :])
        ds = tl.load(rows[:, None] + j * (TM * SUB) + c[None, :])
    if UPCAST:
        b_k = b_k.to(tl.float32)
        ds = ds.to(tl.float32)
    return _dq_dots(ds, b_k, dq, SUB)


@triton.jit
def _attn_bwd_dq_ds_kernel(
    k_ptr,
    ds_ptr,  # the dS workspace the dk/dv kernel filled (`_ds_store`)
    ds_base_ptr,  # int64 [n_seq * n_kv_heads]: where each (sequence, KV head)'s region starts
    ds_tile_ptr,  # int64 [row tiles]: where each row tile of TM rows starts in a region
    dq_ptr,  # like q
    cu_ptr,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    seq_len, n_kv_heads, kvh0, sm_scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # a multiple of TM
    TM: tl.constexpr,  # rows of a stored tile (DKDV_BLOCK_M)
    SUB: tl.constexpr,  # keys per dot (DQ_BLOCK_N: sets the sum), and per loop step
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
    LONGEST_FIRST: tl.constexpr = False,
):
    """BWD_DS_STORE's dq of BLOCK_M rows: the dq kernel's chain over KV blocks of SUB keys 0, 1, ... up to the
    tile's diagonal, each one dot of the stored dS block and K (nothing recomputed: no Q K^T, no dO V^T, no exp).
    Each row reads its stored tile's blocks one after another (contiguous in memory); a block its tile does not
    have and keys past L are zeros (they add exact zeros, as the dq kernel's masked dS does)."""
    pid_m = _row_tile(LONGEST_FIRST)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = kvh0 + pid_bh % n_kv_heads
    ds_ptr = ds_ptr + tl.multiple_of(tl.load(ds_base_ptr + pid_bh), TM * SUB)
    b, start, L = _sequence(cu_ptr, b, seq_len, VARLEN)
    if pid_m * BLOCK_M >= L * G:
        return
    o_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_pos = o_i // G
    h = kvh * G + o_i % G
    m_row = q_pos < L
    o_d = tl.arange(0, D)
    c = tl.arange(0, SUB)
    t = o_i // TM
    n_blk = _ds_blocks(t, TM, G, SUB)
    rows = ds_ptr + tl.multiple_of(tl.load(ds_tile_ptr + t), TM * SUB) + (o_i % TM) * SUB  # each row's block 0
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + start * stride_ks
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    # blocks every row of the tile sees (every row's tile has them, all keys below L) need no mask, in a tile with
    # no row past L (the last tile of a sequence masks every step)
    pos_lo = (pid_m * BLOCK_M) // G
    pos_hi = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G + 1, L)
    n_full = tl.where(pid_m * BLOCK_M + BLOCK_M <= L * G, (pos_lo + 1) // SUB, 0)
    for j in range(0, n_full):
        dq = _dq_ds_step(dq, k_base, rows, j, stride_ks, o_d, c, L, n_blk, m_row, TM, SUB, UPCAST, False)
    for j in range(n_full, tl.cdiv(pos_hi, SUB)):
        dq = _dq_ds_step(dq, k_base, rows, j, stride_ks, o_d, c, L, n_blk, m_row, TM, SUB, UPCAST, True)
    dq = dq * sm_scale
    row_off = b * stride_qb + h[:, None] * stride_qh + (start + q_pos[:, None]) * stride_qs + o_d[None, :]
    tl.store(dq_ptr + row_off, dq.to(dq_ptr.dtype.element_ty), mask=m_row[:, None])


@triton.jit
def _ds_blocks(t, TM: tl.constexpr, G: tl.constexpr, SUB: tl.constexpr):
    """How many key blocks of SUB keys row tile t (rows t * TM ... t * TM + TM - 1, rows enumerating (position,
    head in group) pairs) has in the dS workspace: blocks 0 ... the one holding the tile's last position."""
    return (t * TM + TM - 1) // G // SUB + 1


@triton.jit
def _ds_store_block(ptr, part, jb, t, L, m_row, G: tl.constexpr, SUB: tl.constexpr, MASKED: tl.constexpr):
    """One key block's dS^T [SUB keys, TM rows] at ptr (row-major [rows, keys] in memory)."""
    TM: tl.constexpr = part.shape[1]
    ptrs = ptr + tl.arange(0, TM)[None, :] * SUB + tl.arange(0, SUB)[:, None]
    if MASKED:
        # keys below L in a block the tile has (block jb < n blocks iff its keys are below n * SUB)
        lim = tl.minimum(L, _ds_blocks(t, TM, G, SUB) * SUB)
        keep = m_row[None, :] & (jb * SUB + tl.arange(0, SUB) < lim)[:, None]
        tl.store(ptrs, part, mask=keep)
    else:
        tl.store(ptrs, part)


@triton.jit
def _ds_store(ds_ptr, tile_ptr, dst, i0, jb, L, m_row, G: tl.constexpr, SUB: tl.constexpr, MASKED: tl.constexpr):
    """dS^T [keys, rows] of a key tile of SUB or 2 * SUB keys (whose first key block is jb) and the row tile at
    row i0 into the workspace: block b of row tile t is [TM rows, SUB keys] (row-major) at tile_ptr[t] + b * TM *
    SUB, so a tile's blocks lie one after another in key order (`_attn_bwd_dq_ds_kernel` streams them). A block
    past the tile's last one (the second half of a 2 * SUB key tile at the diagonal) is not stored: no row of the
    tile sees it."""
    BN: tl.constexpr = dst.shape[0]
    TM: tl.constexpr = dst.shape[1]
    t = i0 // TM
    base = ds_ptr + tl.multiple_of(tl.load(tile_ptr + t), TM * SUB) + jb.to(tl.int64) * (TM * SUB)
    dst = dst.to(ds_ptr.dtype.element_ty)
    if BN == SUB:
        _ds_store_block(base, dst, jb, t, L, m_row, G, SUB, MASKED)
    else:
        d0, d1 = tl.split(tl.permute(tl.reshape(dst, [2, SUB, TM]), (1, 2, 0)))
        _ds_store_block(base, d0, jb, t, L, m_row, G, SUB, MASKED)
        _ds_store_block(base + TM * SUB, d1, jb + 1, t, L, m_row, G, SUB, MASKED)


@triton.jit
def _bwd_dkdv_rows(b_k, b_v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, i0, b, kvh, start, L, k_pos, o_d,
                   stride_qb, stride_qh, stride_qs, stride_lb, stride_lh, stride_ls, qk_scale, ws_ptr, cnt_ptr, turn,
                   ds_ptr, ds_tile_ptr, G: tl.constexpr, P_TY: tl.constexpr, BLOCK_M: tl.constexpr,
                   UPCAST: tl.constexpr, MASKED: tl.constexpr, FUSED: tl.constexpr, SUB: tl.constexpr,
                   DS_STORE: tl.constexpr):
    """dk, dv += one tile of BLOCK_M query rows, computed transposed ([keys, rows]) so that no register tile is
    transposed. MASKED: causal, row and length masks; else every row sees every key of the block.
    FUSED: also dq of the tile += dS @ K, added into the fp32 workspace in its turn (`_bwd_dq_in_turn`).
    DS_STORE: dS (rounded as the dq kernel rounds it) is stored into the (sequence, KV head)'s region at ds_ptr
    (`_ds_store`), for `_attn_bwd_dq_ds_kernel`."""
    o_i = i0 + tl.arange(0, BLOCK_M)
    q_pos = o_i // G
    h = kvh * G + o_i % G
    m_row = q_pos < L
    row_base = b * stride_qb + h * stride_qh + (start + q_pos) * stride_qs
    row_t = row_base[None, :] + o_d[:, None]  # [D, BM]: q is loaded transposed
    row = row_base[:, None] + o_d[None, :]  # [BM, D]
    l_off = b * stride_lb + h * stride_lh + (start + q_pos) * stride_ls
    if MASKED:
        b_qt = tl.load(q_ptr + row_t, mask=m_row[None, :], other=0.0)
        b_do = tl.load(do_ptr + row, mask=m_row[:, None], other=0.0)
        b_lse = tl.load(lse_ptr + l_off, mask=m_row, other=0.0)
        b_delta = tl.load(delta_ptr + l_off, mask=m_row, other=0.0)
    else:
        b_qt = tl.load(q_ptr + row_t)
        b_do = tl.load(do_ptr + row)
        b_lse = tl.load(lse_ptr + l_off)
        b_delta = tl.load(delta_ptr + l_off)
    if UPCAST:
        b_qt = b_qt.to(tl.float32)
        b_do = b_do.to(tl.float32)
    st = tl.dot(b_k, b_qt)  # [BN, BM]
    pt = tl.math.exp2(st * qk_scale - b_lse[None, :])
    if MASKED:
        keep = (k_pos[:, None] <= q_pos[None, :]) & (k_pos < L)[:, None] & m_row[None, :]
        pt = tl.where(keep, pt, 0.0)
    dv = tl.dot(pt.to(P_TY).to(b_do.dtype), b_do, dv)
    dpt = tl.dot(b_v, tl.trans(b_do))  # [BN, BM]
    dst = pt * (dpt - b_delta[None, :])
    dst = dst.to(P_TY).to(b_qt.dtype)
    dk = tl.dot(dst, tl.trans(b_qt), dk)
    if DS_STORE:
        _ds_store(ds_ptr, ds_tile_ptr, dst, i0, turn, L, m_row, G, SUB, MASKED)
    if FUSED:
        _bwd_dq_in_turn(tl.trans(dst), b_k, ws_ptr + row, m_row, cnt_ptr + i0 // BLOCK_M, turn, MASKED, SUB, UPCAST)
    return dk, dv


@triton.jit
def _wait_turn(c_ptr, turn, INTERPRET: tl.constexpr):
    """Spin until the counter at c_ptr reads `turn` (then it does: returns 0). Every thread spins with acquire
    loads itself, so each thread's later loads see the writes released with that value, with no barrier after
    it: the loop stays one instruction sequence, which keeps the software pipelining of the row-tile walk (a
    barrier or a nested loop in the walk turns it off). The interpreter has no inline asm: the same spin as a
    loop (it runs programs one after another in ticket order, so there the turn has always come)."""
    if INTERPRET:
        seen = tl.atomic_add(c_ptr, 0, sem="acquire")
        while seen != turn:
            seen = tl.atomic_add(c_ptr, 0, sem="acquire")
    else:
        seen = tl.inline_asm_elementwise(
            """{
            .reg .pred %p;
            wait_${:uid}:
            ld.acquire.gpu.global.b32 $0, [$1];
            setp.ne.s32 %p, $0, $2;
            @%p bra wait_${:uid};
            }""",
            "=r,l,r", [c_ptr, turn], dtype=tl.int32, is_pure=False, pack=1)
    return seen - turn


@triton.jit
def _pass_turn(c_ptr, turn, INTERPRET: tl.constexpr):
    """Hand the tile to the next block: a CTA barrier (every thread's stores issued before it), then one release
    store of the new count, which publishes them all (the barrier orders them before it). The barrier is opaque
    asm for the same reason as the spin."""
    if not INTERPRET:
        tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [turn], dtype=tl.int32, is_pure=False,
                                  pack=1)
    tl.atomic_xchg(c_ptr, turn, sem="release")


@triton.jit
def _bwd_dq_in_turn(ds, b_k, w_ptrs, m_row, c_ptr, turn, MASKED: tl.constexpr, SUB: tl.constexpr,
                    INTERPRET: tl.constexpr):
    """The fused dq: one row tile's fp32 accumulator in the workspace (w_ptrs) += ds @ K, as the dq kernel's chain
    does it: one dot per SUB (= DQ_BLOCK_N) keys, in key order. The counter at c_ptr counts the SUB-key blocks
    already added to this tile; this program's first is block `turn`. It waits for its turn, adds, and passes
    the turn on (a barrier first, so every thread's store is done before the release)."""
    BN: tl.constexpr = ds.shape[1]
    # the workspace address depends on the spin's result (+ 0), so no load of it can be issued before the spin
    w_ptrs = w_ptrs + _wait_turn(c_ptr, turn, INTERPRET)
    if MASKED:
        acc = tl.load(w_ptrs, mask=m_row[:, None], other=0.0, cache_modifier=".cg")
    else:
        acc = tl.load(w_ptrs, cache_modifier=".cg")
    acc = _dq_dots(ds, b_k, acc, SUB)
    if MASKED:
        tl.store(w_ptrs, acc, mask=m_row[:, None])
    else:
        tl.store(w_ptrs, acc)
    _pass_turn(c_ptr, turn + BN // SUB, INTERPRET)


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,
    dk_ptr, dv_ptr,  # like k
    lse_ptr, delta_ptr,
    cu_ptr,
    ws_ptr,  # FUSED: fp32 dq accumulator, shaped and strided like q
    cnt_ptr,  # FUSED: int32 [1 + n_seq * n_kv_heads * n_tiles], zeroed: the ticket, then each row tile's turn
    ds_ptr,  # DS_STORE: the dS workspace (q's dtype), one region per (sequence, KV head) of this launch
    ds_base_ptr,  # DS_STORE: int64 [n_seq * n_kv_heads]: where each region starts
    ds_tile_ptr,  # DS_STORE: int64 [row tiles]: where each row tile's blocks start in a region (`_ds_store`)
    kvh0,  # the first KV head of this launch (n_kv_heads of them; the dS workspace may not hold all heads at once)
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_lb, stride_lh, stride_ls,
    seq_len, n_kv_heads, qk_scale, sm_scale,
    n_bh,  # FUSED: (sequence, KV head) pairs
    n_tiles,  # FUSED: row tiles of the longest sequence's group
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,
    UPCAST: tl.constexpr,
    FUSED: tl.constexpr = False,
    SUB: tl.constexpr = 64,  # FUSED, DS_STORE: keys per dq dot (DQ_BLOCK_N)
    DS_STORE: tl.constexpr = False,
):
    """dk, dv of BLOCK_N keys: the group's query rows (position, head) in tiles of BLOCK_M (which sets the sum),
    in order from the last tile down to the first that can see the block; tiles are aligned to multiples of
    BLOCK_M whatever BLOCK_N is, so BLOCK_N changes no bits.

    FUSED: also dq, each row tile's sum in KV-block order (see `_bwd_dq_in_turn`). Program ids come from a ticket
    (an atomic counter), not the launch index, so a program for block j starts only after the one for block
    j - 1 of its (sequence, KV head) has started: the wait for block j - 1 is always on a running (or finished)
    program, and block 0 never waits, whatever order the hardware dispatches in. Tickets run through the
    (sequence, KV head) pairs fastest, so the programs resident at once spread over every pair's first blocks."""
    if FUSED:
        ticket = tl.atomic_add(cnt_ptr, 1)
        pid_n = ticket // n_bh
        pid_bh = (ticket % n_bh).to(tl.int64)
        cnt_ptr = cnt_ptr + 1 + pid_bh * n_tiles
    else:
        pid_n = tl.program_id(0)
        pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // n_kv_heads
    kvh = kvh0 + pid_bh % n_kv_heads
    if DS_STORE:
        ds_ptr = ds_ptr + tl.multiple_of(tl.load(ds_base_ptr + pid_bh), BLOCK_M * SUB)
    b, start, L = _sequence(cu_ptr, b, seq_len, VARLEN)
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
    # row tiles from the last down to the first that sees the block (this order sets dk's and dv's sums): the
    # last, partial tile (masked), those that see every key (unmasked), then those that cross the block's
    # diagonal (masked). Last to first is what keeps FUSED's hand-over a wavefront (see the module docstring).
    n_rows = L * G
    i_lo = (pid_n * BLOCK_N * G) // BLOCK_M * BLOCK_M
    i_stop = tl.cdiv(n_rows, BLOCK_M) * BLOCK_M
    i_full = tl.minimum(tl.maximum(tl.cdiv((pid_n * BLOCK_N + BLOCK_N - 1) * G, BLOCK_M) * BLOCK_M, i_lo), i_stop)
    i_tail = tl.maximum(i_full, n_rows // BLOCK_M * BLOCK_M)
    turn = pid_n * (BLOCK_N // SUB)  # FUSED: SUB-key blocks every row tile holds before this program's
    for t in range(0, (i_stop - i_tail) // BLOCK_M):
        dk, dv = _bwd_dkdv_rows(b_k, b_v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, i_stop - BLOCK_M - t * BLOCK_M,
                                b, kvh, start, L, k_pos, o_d, stride_qb, stride_qh, stride_qs, stride_lb, stride_lh,
                                stride_ls, qk_scale, ws_ptr, cnt_ptr, turn, ds_ptr, ds_tile_ptr, G, P_TY, BLOCK_M,
                                UPCAST, True, FUSED, SUB, DS_STORE)
    for t in range(0, (i_tail - i_full) // BLOCK_M):
        dk, dv = _bwd_dkdv_rows(b_k, b_v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, i_tail - BLOCK_M - t * BLOCK_M,
                                b, kvh, start, L, k_pos, o_d, stride_qb, stride_qh, stride_qs, stride_lb, stride_lh,
                                stride_ls, qk_scale, ws_ptr, cnt_ptr, turn, ds_ptr, ds_tile_ptr, G, P_TY, BLOCK_M,
                                UPCAST, False, FUSED, SUB, DS_STORE)
    for t in range(0, (i_full - i_lo) // BLOCK_M):
        dk, dv = _bwd_dkdv_rows(b_k, b_v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, i_full - BLOCK_M - t * BLOCK_M,
                                b, kvh, start, L, k_pos, o_d, stride_qb, stride_qh, stride_qs, stride_lb, stride_lh,
                                stride_ls, qk_scale, ws_ptr, cnt_ptr, turn, ds_ptr, ds_tile_ptr, G, P_TY, BLOCK_M,
                                UPCAST, True, FUSED, SUB, DS_STORE)
    dk = dk * sm_scale
    tl.store(dk_ptr + k_off, dk.to(dk_ptr.dtype.element_ty), mask=m_k[:, None])
    tl.store(dv_ptr + v_off, dv.to(dv_ptr.dtype.element_ty), mask=m_k[:, None])


@triton.jit
def _attn_bwd_dq_finish_kernel(ws_ptr, dq_ptr, n, sm_scale, BLOCK: tl.constexpr):
    """FUSED: dq = acc * sm_scale in q's dtype, the dq kernel's last step, elementwise over the workspace."""
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    dq = tl.load(ws_ptr + off, mask=m, other=0.0) * sm_scale
    tl.store(dq_ptr + off, dq.to(dq_ptr.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------- host launchers


def _tiles() -> dict:
    """Effective tile sizes. The interpreter gets small blocks and chunks so tiny shapes span several chunks."""
    if INTERPRET:
        return {**CONFIG, "BLOCK_N": CONFIG["BLOCK_N_INTERPRET"], "CHUNK_BLOCKS": CONFIG["CHUNK_BLOCKS_INTERPRET"],
                "BLOCK_M": 16, "DECODE_BLOCK_M": 16, "DQ_BLOCK_M": 16, "DQ_BLOCK_N": CONFIG["BLOCK_N_INTERPRET"],
                "DKDV_BLOCK_M": 16, "DS_DQ_BLOCK_M": 16, "DS_MIN_PROGRAMS": 0,
                "DQ_TILE_N": CONFIG["BLOCK_N_INTERPRET"] * CONFIG["DQ_TILE_N"] // CONFIG["DQ_BLOCK_N"],
                # the key tile keeps its ratio to the dq block (the fused dq splits a double tile in two)
                "DKDV_BLOCK_N": CONFIG["BLOCK_N_INTERPRET"] * CONFIG["DKDV_BLOCK_N"] // CONFIG["DQ_BLOCK_N"],
                "DS_DKDV_BLOCK_N": CONFIG["BLOCK_N_INTERPRET"] * CONFIG["DS_DKDV_BLOCK_N"] // CONFIG["DQ_BLOCK_N"]}
    return CONFIG


#: head dims above this get the smaller launches of `_for_head_dim`
_WIDE_HEAD = 128


def _for_head_dim(cfg: dict, d: int) -> dict:
    """The launch choices for head dim d. Up to 128 the CONFIG's. At 256 a 128-key K and V tile is 64 KB each, so
    the CONFIG's launches would ask for more shared memory than an H200 has (forward with 2 stages 331 KB, decode
    with 3 stages 287 KB, the dq kernel with 128 rows 262 KB, against 232,448 B: sm_90 compiles of
    benchmarks/attn_ir_offline.py --head-dim 256): one forward stage, two decode stages, 64-row dq tiles of 64-key
    steps, and 64-key dk/dv tiles when dS is stored (and 64-row forward tiles: 128 spill 2.8 KB a thread). All of
    them only choose who computes what (no bit changes)."""
    if d <= _WIDE_HEAD or INTERPRET:
        return cfg
    sub = cfg["DQ_BLOCK_N"]
    return {**cfg, "BLOCK_M": 64, "num_stages": 1, "decode_num_stages": min(cfg["decode_num_stages"], 2),
            "DQ_BLOCK_M": 64, "DQ_TILE_N": sub, "dq_num_stages": min(cfg.get("dq_num_stages", 2), 2),
            "DS_DKDV_BLOCK_N": sub, "DS_DQ_BLOCK_M": cfg["DKDV_BLOCK_M"],
            "bwd_num_stages": min(cfg["bwd_num_stages"], 2)}


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


def _kv_descriptor(t: torch.Tensor, varlen: bool, block_n: int):
    """(TMA descriptor, (rb, rh, ch)) for K or V, or None when TMA cannot read it.

    The descriptor sees the tensor as a matrix whose rows are positions (row stride = the position stride) and
    whose [block_n, D] block for (batch b, KV head h, positions p ...) starts at row b*rb + h*rh + p, column
    h*ch: heads are whole rows apart in a [B, H, S, D] layout (rh = S, ch = 0) and columns apart in a
    [B, S, H, D] or packed [T, H, D] one (rh = 0, ch = the head stride).
    """
    if TensorDescriptor is None or t.data_ptr() % 16 or t.stride(-1) != 1:
        return None
    sb, sh, ss = _row_strides(t, varlen)
    d, size = t.shape[-1], t.element_size()
    if (ss * size) % 16 or (d * size) % 16 or sb % ss:
        return None
    span = sh * (t.shape[-2 if varlen else 1] - 1) + d  # a position's heads, first element to last
    if sh % ss == 0:  # heads are rows apart: the row is one head's position
        rb, rh, ch, cols = sb // ss, sh // ss, 0, d
    elif span <= ss:  # every head inside one position's row
        rb, rh, ch, cols = sb // ss, 0, sh, span
    else:
        return None
    # the rows whose `cols` elements lie inside the storage: a row is `cols` wide, not `ss` (a column slice of a
    # fused projection ends its last row before the storage's end; counting whole strides left that row out, and a
    # TMA load past the descriptor's rows reads zeros)
    avail = t.untyped_storage().nbytes() // size - t.storage_offset()
    if avail < cols:
        return None
    rows = (avail - cols) // ss + 1
    desc = TensorDescriptor(t, [rows, cols], [ss, 1], [block_n, d])
    return desc, (rb, rh, ch)


@functools.cache
def _gluon():
    """ops/attention_gluon.py, or None where this Triton has no Gluon for Hopper (imported on first use: the
    interpreter never needs it)."""
    try:
        from tik_kernels.ops import attention_gluon
    except ImportError:  # pragma: no cover - a Triton without Gluon
        return None
    return attention_gluon


def _gluon_applies(q: torch.Tensor, cfg: dict, varlen: bool = False) -> bool:
    """Whether the forward runs as ops/attention_gluon.py's kernel (FWD_GLUON; packed sequences FWD_GLUON_VARLEN too):
    bf16, head dim 128 and the GPU tree (128-key blocks, chunks of 4) on a Hopper GPU with Triton's Gluon; K and V
    must also be readable through TMA (`_fwd` checks that)."""
    if INTERPRET or not cfg.get("FWD_GLUON", 0) or (varlen and not cfg.get("FWD_GLUON_VARLEN", 0)):
        return False
    if q.dtype != torch.bfloat16 or q.shape[-1] != 128:
        return False
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    g = _gluon()
    return g is not None and (cfg["BLOCK_N"], cfg["CHUNK_BLOCKS"]) == (g.BLOCK_N, g.CHUNK_BLOCKS)


def _fwd(q, k, v, cu, n_seq, max_len, seq_len, scale, varlen):
    """Launch the fused forward; q/k/v last dim contiguous. Returns (o, lse)."""
    hq, hk, d = q.shape[-2 if varlen else 1], k.shape[-2 if varlen else 1], q.shape[-1]
    cfg = _for_head_dim(_tiles(), d)
    G = hq // hk
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    lse_strides = (0, lse.stride(1), lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1), lse.stride(2))
    block_n = cfg["BLOCK_N"]  # the KV block: the launch and the descriptors read the same one
    if _gluon_applies(q, cfg, varlen):
        kd, vd = _kv_descriptor(k, varlen, block_n), _kv_descriptor(v, varlen, block_n)
        if kd is not None and vd is not None:
            strides = (*_row_strides(q, varlen), *_row_strides(k, varlen), *_row_strides(v, varlen),
                       *_row_strides(o, varlen), *lse_strides)
            _gluon().launch(q, k, v, o, lse, cu, kd, vd, strides, seq_len, n_seq, max_len, hk, G, scale * _LOG2E,
                            varlen)
            return o, lse
    grid = (triton.cdiv(max_len * G, cfg["BLOCK_M"]), n_seq * hk)
    in_memory = bool(cfg.get("FWD_TOTAL_IN_MEMORY", 0))
    scratch = torch.empty(grid[0] * grid[1] * cfg["BLOCK_M"] * d if in_memory else 1, dtype=torch.float32,
                          device=q.device)
    kd = vd = None
    if cfg.get("FWD_TMA", 0):
        kd, vd = _kv_descriptor(k, varlen, block_n), _kv_descriptor(v, varlen, block_n)
    tma = kd is not None and vd is not None
    _attn_fwd_kernel[grid](
        q, k, v, o, lse, cu, scratch,
        kd[0] if tma else k, vd[0] if tma else v, *(kd[1] if tma else (0, 0, 0)), *(vd[1] if tma else (0, 0, 0)),
        *_row_strides(q, varlen), *_row_strides(k, varlen), *_row_strides(v, varlen), *_row_strides(o, varlen),
        *lse_strides, seq_len, hk, scale * _LOG2E,
        G=G, D=d, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, CHUNK=cfg["CHUNK_BLOCKS"], VARLEN=varlen,
        UPCAST=INTERPRET, TOTAL_IN_MEMORY=in_memory, TMA=tma, LONGEST_FIRST=bool(cfg.get("FWD_LONGEST_FIRST", 0)),
        ONE_LOOP=bool(cfg.get("FWD_ONE_LOOP", 0)), **_launch_opts(cfg["num_warps"], cfg["num_stages"]),
    )
    return o, lse


def _ds_max_bytes(device: torch.device) -> int:
    """TIK_ATTN_DS_MAX_BYTES from the environment (bytes, a non-negative integer), else DS_STORE_MAX_BYTES, but at
    most an eighth of a GPU's memory (8 GiB is 6% of an H200, a third of a 24 GB card)."""
    raw = os.environ.get("TIK_ATTN_DS_MAX_BYTES")
    if raw is not None:
        if not raw.strip().isdigit():
            raise ValueError(f"TIK_ATTN_DS_MAX_BYTES must be a number of bytes (0 or more), got {raw!r}")
        return int(raw)
    if device.type == "cuda":
        return min(DS_STORE_MAX_BYTES, _device_bytes(device) // 8)
    return DS_STORE_MAX_BYTES


@functools.lru_cache(maxsize=16)
def _device_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def _ds_tile_blocks(t, tm: int, G: int, sub: int):
    """The host's `_ds_blocks`: key blocks row tile t holds in the dS workspace (t an int or an integer tensor)."""
    return (t * tm + tm - 1) // G // sub + 1


@functools.lru_cache(maxsize=64)
def _ds_blocks_before(n: int, tm: int, G: int, sub: int) -> int:
    """Blocks the row tiles 0 ... n - 1 hold in the dS workspace."""
    return sum(_ds_tile_blocks(t, tm, G, sub) for t in range(n))


#: BWD_DS_STORE's row-tile starts, per (tile rows, group, keys per block, device), for a power-of-two count of
#: tiles (a table is a prefix of every longer one, so a few sizes serve every length). Kept for good: a captured
#: CUDA graph may read one, so none may be freed. Not filled while a graph is being captured (a tensor made then
#: lives in the graph's memory pool).
_DS_TILES: dict = {}


def _ds_tile_starts(n_tiles: int, tm: int, G: int, sub: int, device: torch.device) -> torch.Tensor:
    """Where each row tile's blocks start in a region (entries), for at least n_tiles + 4 tiles (the dq kernel's
    last row tile may reach a few tiles past the longest sequence's end)."""
    n = triton.next_power_of_2(n_tiles + 4)
    key = (n, tm, G, sub, device)
    if key in _DS_TILES:
        return _DS_TILES[key]
    blocks = _ds_tile_blocks(torch.arange(n, device=device), tm, G, sub)
    start = torch.zeros(n, dtype=torch.long, device=device)
    start[1:] = torch.cumsum(blocks[:-1] * (tm * sub), 0)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _DS_TILES[key] = start
    return start


def _ds_plan(q, cu, n_seq, max_len, seq_len, G, hk, sub, tm, bn, min_programs, varlen):
    """BWD_DS_STORE's workspace: (dS buffer, int64 region starts [n_seq * hc], int64 row-tile starts, hc KV heads
    per launch), or None where the dq kernel computes dq instead: one KV head's dS would pass the budget
    (`_ds_max_bytes`), or a dk/dv launch would have fewer than min_programs programs.

    Row tile t (tm rows) holds blocks 0 ... (t * tm + tm - 1) // G // sub of sub keys, tm * sub entries each, one
    after another; tiles follow each other (tile t starts at the sum of the earlier tiles' sizes, the same in
    every region), so a region is the causal half of dS and a sequence of n tiles needs start[n] entries per KV
    head. Dense: exactly that per sequence. Packed: sum_s start[n_s] <= (sum_s n_s) * (the last tile's size)
    bounds the buffer without reading the lengths on the host; the regions' starts are computed on the device from
    cu. hc is the largest divisor of the KV heads that fits, so every launch has hc heads. Everything the decision
    needs is known on the host: nothing waits for the device, and the whole backward can be captured in a graph."""
    dev = q.device
    n_tiles = -(-max_len * G // tm)
    if varlen:
        per_head = (q.shape[0] * G // tm + n_seq) * _ds_tile_blocks(n_tiles - 1, tm, G, sub) * tm * sub
        # programs of one dk/dv launch that have keys (at most every token's blocks plus one per sequence)
        blocks = min(n_seq * triton.cdiv(max_len, bn), triton.cdiv(q.shape[0], bn) + n_seq)
    else:
        per_head = n_seq * tm * sub * _ds_blocks_before(n_tiles, tm, G, sub)
        blocks = n_seq * triton.cdiv(max_len, bn)
    fit = _ds_max_bytes(dev) // max(1, per_head * q.element_size())
    hc = max((h for h in range(1, hk + 1) if hk % h == 0 and h <= fit), default=0)
    if hc == 0 or blocks * hc < min_programs:
        return None

    tile_start = _ds_tile_starts(n_tiles, tm, G, sub, dev)
    base = _ds_region_starts(cu, tile_start, n_seq, G, tm, hc, per_head, varlen, dev)
    try:
        ds = _ds_alloc(hc * per_head, q.dtype, dev)
    except torch.OutOfMemoryError:  # the memory is not there now: recompute dS instead (the same bits)
        return None
    return ds, base, tile_start, hc


#: `_ds_region_starts`' last results: (key, cu, starts). The cu kept alive keeps its address its own: a live
#: tensor at that address with the same version counter holds the same lengths.
_DS_BASES: list = []


def _ds_region_starts(cu, tile_start, n_seq, G, tm, hc, per_head, varlen, dev) -> torch.Tensor:
    """Where each (sequence, KV head) region of the dS workspace starts (int64 [n_seq * hc]). Packed: from the
    lengths in cu, on the device (a dozen small launches); every layer of a model's backward passes the same cu
    and shapes, so the result of the first is reused by the rest, keyed on cu's storage, its version counter (an
    in-place change to cu makes a new key) and the rest of the arguments. Neither read nor kept while a graph is
    being captured: a tensor made then lives in the graph's memory pool, and one from the cache could be freed (pushed
    out by later entries) while the graph still reads it."""
    capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
    key = (cu.data_ptr() if varlen else None, cu._version if varlen else None, tuple(cu.shape), n_seq, G, tm, hc,
           per_head, varlen, dev, tile_start.data_ptr())
    for k, _, starts in () if capturing else _DS_BASES:
        if k == key:
            return starts
    if varlen:
        need = tile_start[((cu[1:] - cu[:-1]).long() * G + tm - 1) // tm]
        starts = hc * (torch.cumsum(need, 0) - need)
        base = (starts[:, None] + torch.arange(hc, device=dev)[None, :] * need[:, None]).reshape(-1).contiguous()
    else:  # every region the same size: (b * hc + h) * per sequence
        base = torch.arange(n_seq * hc, device=dev) * (per_head // n_seq)
    if not capturing:
        _DS_BASES.insert(0, (key, cu, base))
        del _DS_BASES[4:]
    return base


def _ds_alloc(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device=device)


def _bwd(q, k, v, o, lse, do, cu, n_seq, max_len, seq_len, scale, varlen):
    hq, hk, d = q.shape[-2 if varlen else 1], k.shape[-2 if varlen else 1], q.shape[-1]
    cfg = _for_head_dim(_tiles(), d)
    G = hq // hk
    # q, o and dO are read with one set of strides (lse's rows are contiguous already); k and v too, since dk and
    # dv are written with k's and v's strides (a column slice of a fused qkv projection has gaps between rows that
    # torch.empty_like would not keep: the stores would land outside dk)
    q, o, do = q.contiguous(), o.contiguous(), do.contiguous()
    k, v = k.contiguous(), v.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    lse_strides = (0, lse.stride(1), lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1), lse.stride(2))
    _attn_bwd_delta_kernel[(n_seq * hq, triton.cdiv(max_len, 16))](
        o, do, delta, cu, *_row_strides(q, varlen), *lse_strides, seq_len, hq, D=d, VARLEN=varlen,
        **_launch_opts(4, 1))
    common = dict(G=G, D=d, VARLEN=varlen, UPCAST=INTERPRET,
                  **_launch_opts(cfg["bwd_num_warps"], cfg["bwd_num_stages"]))
    strides = (*_row_strides(q, varlen), *_row_strides(k, varlen), *_row_strides(v, varlen), *lse_strides)
    n_blocks = triton.cdiv(max_len, cfg["DKDV_BLOCK_N"])
    if cfg.get("BWD_DQ_FUSED", 0):
        sub, bn = cfg["DQ_BLOCK_N"], cfg["DKDV_BLOCK_N"]
        if bn not in (sub, 2 * sub):
            raise ValueError(f"BWD_DQ_FUSED needs DKDV_BLOCK_N = DQ_BLOCK_N or twice it, got {bn} and {sub}")
        # the dq sums in fp32, laid out like q (q is contiguous here, so q's strides address it); the counters:
        # a ticket, then per (sequence, KV head) and row tile the number of DQ_BLOCK_N-key blocks added so far
        ws = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        n_tiles = triton.cdiv(max_len * G, cfg["DKDV_BLOCK_M"])
        cnt = torch.zeros(1 + n_seq * hk * n_tiles, dtype=torch.int32, device=q.device)
        _attn_bwd_dkdv_kernel[(n_seq * hk * n_blocks,)](
            q, k, v, do, dk, dv, lse, delta, cu, ws, cnt, ws, cnt, cnt, 0, *strides, seq_len, hk, scale * _LOG2E, scale,
            n_seq * hk, n_tiles, BLOCK_M=cfg["DKDV_BLOCK_M"], BLOCK_N=bn, FUSED=True, SUB=sub, **common)
        _attn_bwd_dq_finish_kernel[(triton.cdiv(ws.numel(), 1024),)](ws, dq, ws.numel(), scale, BLOCK=1024,
                                                                      **_launch_opts(4, 1))
        return dq, dk, dv
    sub = cfg["DQ_BLOCK_N"]
    if cfg.get("BWD_DS_STORE", 0):
        tm, bn, bm = cfg["DKDV_BLOCK_M"], cfg["DS_DKDV_BLOCK_N"], cfg["DS_DQ_BLOCK_M"]
        if bn not in (sub, 2 * sub) or bm % tm:
            raise ValueError("BWD_DS_STORE needs DS_DKDV_BLOCK_N = DQ_BLOCK_N or twice it and DS_DQ_BLOCK_M a "
                             f"multiple of DKDV_BLOCK_M, got {bn}, {sub}, {bm}, {tm}")
        plan = _ds_plan(q, cu, n_seq, max_len, seq_len, G, hk, sub, tm, bn, cfg.get("DS_MIN_PROGRAMS", 0), varlen)
        if plan is not None:
            ds, base, tiles, hc = plan
            for kvh0 in range(0, hk, hc):
                _attn_bwd_dkdv_kernel[(triton.cdiv(max_len, bn), n_seq * hc)](
                    q, k, v, do, dk, dv, lse, delta, cu, dq, cu, ds, base, tiles, kvh0, *strides, seq_len, hc,
                    scale * _LOG2E, scale, 0, 0, BLOCK_M=tm, BLOCK_N=bn, SUB=sub, DS_STORE=True, **common)
                _attn_bwd_dq_ds_kernel[(triton.cdiv(max_len * G, bm), n_seq * hc)](
                    k, ds, base, tiles, dq, cu, *_row_strides(q, varlen), *_row_strides(k, varlen), seq_len, hc, kvh0,
                    scale, G=G, D=d, BLOCK_M=bm, TM=tm, SUB=sub, VARLEN=varlen, UPCAST=INTERPRET,
                    LONGEST_FIRST=bool(cfg.get("DS_LONGEST_FIRST", 0)),
                    **_launch_opts(cfg["ds_dq_num_warps"], cfg["ds_dq_num_stages"]))
            return dq, dk, dv
    grid = (triton.cdiv(max_len * G, cfg["DQ_BLOCK_M"]), n_seq * hk)
    tile = cfg.get("DQ_TILE_N", sub)
    if tile not in (sub, 2 * sub):
        raise ValueError(f"DQ_TILE_N must be DQ_BLOCK_N or twice it, got {tile} and {sub}")
    kd = vd = None
    if cfg.get("DQ_TMA", 0):
        kd, vd = _kv_descriptor(k, varlen, tile), _kv_descriptor(v, varlen, tile)
    tma = kd is not None and vd is not None
    _attn_bwd_dq_kernel[grid](
        q, k, v, do, dq, lse, delta, cu, kd[0] if tma else k, vd[0] if tma else v,
        *(kd[1] if tma else (0, 0, 0)), *(vd[1] if tma else (0, 0, 0)), *strides, seq_len, hk, scale * _LOG2E,
        scale, G=G, D=d, BLOCK_M=cfg["DQ_BLOCK_M"], BLOCK_N=tile, SUB=sub, VARLEN=varlen, UPCAST=INTERPRET, TMA=tma,
        LONGEST_FIRST=bool(cfg.get("DQ_LONGEST_FIRST", 0)),
        **_launch_opts(cfg.get("dq_num_warps", cfg["bwd_num_warps"]), cfg.get("dq_num_stages", cfg["bwd_num_stages"])))
    _attn_bwd_dkdv_kernel[(n_blocks, n_seq * hk)](q, k, v, do, dk, dv, lse, delta, cu, dq, cu, dq, cu, cu, 0, *strides,
                                                  seq_len, hk, scale * _LOG2E, scale, 0, 0,
                                                  BLOCK_M=cfg["DKDV_BLOCK_M"], BLOCK_N=cfg["DKDV_BLOCK_N"], **common)
    return dq, dk, dv


_DECODE_COUNTERS: dict = {}


def _decode_counters(device: torch.device, n: int) -> torch.Tensor:
    """n zeroed int32 arrival counters on `device`, kept between calls (each fused decode leaves them zero); launches
    that overlap on two streams of one device must not both use them."""
    cnt = _DECODE_COUNTERS.get(device)
    if cnt is None or cnt.numel() < n:
        cnt = _DECODE_COUNTERS[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return cnt


def _decode(q, k_cache, v_cache, lens, scale):
    B, hq, _, d = q.shape
    hk, cap = k_cache.shape[1], k_cache.shape[2]
    cfg = _tiles()
    if cap <= cfg.get("DECODE_SHORT_KEYS", 0):
        cfg = {**cfg, "decode_num_warps": cfg["decode_short_num_warps"],
               "decode_num_stages": cfg["decode_short_num_stages"],
               "decode_maxnreg": cfg.get("decode_short_maxnreg", 0)}
    cfg = _for_head_dim(cfg, d)
    G = hq // hk
    bm = max(cfg["DECODE_BLOCK_M"], triton.next_power_of_2(G))
    bn, chunk = cfg["BLOCK_N"], cfg["CHUNK_BLOCKS"]
    lens = lens.to(device=q.device, dtype=torch.int32).contiguous()
    n_chunks = triton.cdiv(cap, bn * chunk)  # chunks of the longest sequence the cache can hold
    o = torch.empty_like(q)
    # the split is free (same tree, same bits): fold in-program when the cache holds one chunk or when the
    # (sequence, KV head) pairs alone fill the GPU
    fold = n_chunks == 1 or B * hk >= cfg["DECODE_FOLD_GROUPS"]
    per_prog = cfg["DECODE_CHUNKS_PER_PROG"]
    fused = not fold and n_chunks <= cfg.get("DECODE_FUSED_MAX_CHUNKS", 0)
    cnt = _decode_counters(q.device, B * hk) if fused else lens
    if fold:
        wm = wl = wa = o  # unused
        grid = (B * hk, 1)
    else:
        wm = torch.empty((B, hq, n_chunks), dtype=torch.float32, device=q.device)
        wl = torch.empty_like(wm)
        wa = torch.empty((B, hq, n_chunks, d), dtype=torch.float32, device=q.device)
        grid = (B * hk, triton.cdiv(n_chunks, per_prog))
    pdl = pdl_launch(cfg.get("DECODE_PDL"), q.device)
    _attn_decode_kernel[grid](
        q, k_cache, v_cache, o, wm, wl, wa, lens, cnt,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), o.stride(0), o.stride(1),
        wm.stride(0), wm.stride(1), wa.stride(0), wa.stride(1), wa.stride(2), hk, scale * _LOG2E,
        FUSED=fused, GROUP=cfg["COMBINE_CHUNKS"],
        G=G, D=d, BLOCK_M=bm, BLOCK_N=bn, CHUNK=chunk, CHUNKS_PER_PROG=per_prog, FOLD=fold, UPCAST=INTERPRET,
        **_launch_opts(cfg["decode_num_warps"], cfg["decode_num_stages"]),
        **maxnreg_launch(cfg.get("decode_maxnreg", 0)), **pdl,
    )
    if not fold and not fused:
        bd = min(cfg["COMBINE_BLOCK_D"], d)
        _attn_decode_combine_kernel[(B * hk, d // bd)](
            wm, wl, wa, o, lens, wm.stride(0), wm.stride(1), wa.stride(0), wa.stride(1), wa.stride(2),
            o.stride(0), o.stride(1), hk,
            G=G, BLOCK_G=triton.next_power_of_2(G), BLOCK_D=bd, CHUNK_KEYS=bn * chunk, GROUP=cfg["COMBINE_CHUNKS"],
            **_launch_opts(cfg["combine_num_warps"], 1), **pdl,
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
