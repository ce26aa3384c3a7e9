"""Fused lm_head + temperature + log-softmax + gather, batch-invariant:
`logprob(hidden[T, H], w[V, H], targets[T], temperature) -> fp32[T]`.

out[t] = log_softmax(hidden @ w.T / temperature)[t, targets[t]], never materializing [T, V] logits.

Invariance: a token's result depends only on its own row. The grid is (token blocks, V chunks);
BLOCK_T, BLOCK_V, BLOCK_K and V_CHUNK are fixed by CONFIG (never chosen by T). A program
computes the logits of its BLOCK_T tokens over one chunk of V_CHUNK vocabulary entries, one
[BLOCK_T, BLOCK_V] tile at a time, each tile a K-sequential `tl.dot` over H in BLOCK_K steps
(no split-K), divided by the temperature in fp32; it keeps an online (max, Σexp) per token over
the tiles in increasing v. A second kernel merges the V_CHUNK partials of each token in
increasing chunk order (CHUNKS, how many chunks one program walks in turn, only launches it). So the reduction
order of every token is fixed by (V, H, CONFIG) alone:
the same whatever T, the token's slot in its block, or which other tokens share the call.
Masked rows load zeros and their results are never stored.

The logits tile (dot, then `/ temperature`) is one function that `entropy` and `sample` call too
(`ops/_lmhead.py`), so the three operators see the same fp32 logits: a sampled token's logprob is the logit the
sampler used.

Backward recomputes the logits tiles: dz = g·(onehot − p)/temperature for BWD_CHUNK_T tokens at a
time (a fixed-size [BWD_CHUNK_T, V] scratch, never [T, V]), then grad_hidden = dz @ w and
grad_w = Σ_t dz[t]ᵀ hidden[t], both plain K-sequential matmul kernels whose dots take dz rounded to
the operands' dtype; grad_w accumulates the token chunks in order into an fp32 [V, H] buffer owned
tile by tile (no atomics): deterministic. The interpreter rounds dz as the GPU does (to nearest even,
`round_to`; its own cast truncates), then runs its dots in fp32 (exact for bf16 operands).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels.ops._common import maxnreg_launch, pdl_launch, pdl_start, round_to
from tik_kernels.ops._lmhead import _logits_step, _logits_tile, _rows, grads
from tik_kernels.ops.entropy import _ent_merge, _ent_tile
from tik_kernels.ops.sample import _race_key, _race_merge, _race_scores, _race_step

TUNABLES = {
    "BLOCK_T": (16, 32, 64, 128),
    "BLOCK_V": (64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "V_CHUNK": (256, 512, 1024, 2048, 4096),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
    "BWD_CHUNK_T": (256, 512, 1024, 2048, 4096),
    "BWD_BLOCK_M": (64, 128),
    "BWD_BLOCK_N": (64, 128),
    "BWD_BLOCK_K": (32, 64),
    "BWD_GH_BLOCK_M": (64, 128),
    "BWD_DZ_LOW": (0, 1),
    "BWD_GW_HFAST": (0, 1),
    "BWD_STAGES": (2, 3, 4, 5, 6),
    "PDL": (0, 1),
    "CHUNKS": (1, 2, 4),
    "MERGE_STAGES": (1, 2, 4, 8),
    "FLAT": (0, 1),
    "SLP_STAGES": (2, 3, 4),
    "SLP_MAXNREG": (0, 80, 128, 168),
}
#: PDL: sample_logprob's kernels launched with programmatic dependent launch (ops/_common.py), no bit changes.
#: CHUNKS: V chunks walked by one program of the forward and of sample_logprob, one after another, each from a fresh
#: state and stored in its own slot: who computes a chunk, never its sum (the tree is V_CHUNK's and BLOCK_V's), so no
#: bit changes; fewer, longer programs where the per-program cost shows (benchmarks/bench_lmhead_decode.py)
#: FLAT: sample_logprob's pass walks a chunk's (tile, K step) pairs in one loop, as linear walks its chunks: the same
#: dots in the same order, the next tile's loads in flight across a tile's end (the nested loops drain the pipeline at
#: each of a program's V_CHUNK / BLOCK_V tiles); no bit changes.
#: SLP_STAGES: sample_logprob's pass software-pipelined in this many stages (num_stages stays the forward's and the
#: backward's): the same dots in the same order.
#: Both on by default: H100, decode batch of 64 (qwen3's lm_head), one run, sample_logprob 249.6 us nested with
#: 3 stages, 227.2 FLAT, 215.9 FLAT with 4 stages, bits the same (`benchmarks/bench_lmhead_decode.py --only FLAT`,
#: results/lmhead_decode_h100_s28.json)
#: SLP_MAXNREG: a cap on the pass's registers a thread (Triton's maxnreg; 0: the compiler's choice), so that two
#: programs share an SM: FLAT with 4 stages takes 226 registers a thread, one 8-warp program an SM, so a decode batch's
#: 297 V chunks run in three rounds on 132 SMs, the last a quarter full; capped at 128 it spills nothing (sm_90,
#: Triton 3.6's ptxas) and two fit (2 x 256 threads x 128 registers, 2 x 99 KB of shared memory). Register
#: allocation moves no bits. 128 by default: H100, decode batch of 64, one run, sample_logprob 206.6 us capped at 128
#: against 218.1 uncapped (214.8 at 168), bits the same; the qwen3-0.6b decode step's graph replay 3.380x of its floor
#: against 3.395x at context 128, 2.830x against 2.840x at 256 (`benchmarks/gpu_pending.sh lmhead_regs`,
#: results/lmhead_decode_h100_s29_regs.json, results/e2e_decode_regs_h100_s29/). At 128 the 297 chunks still take two
#: rounds on 132 SMs (264 at a time); capped at 80 with 3 stages three programs fit an SM (80 registers x 256 threads
#: x 3, and 3 x 73 KB of shared memory) and every chunk runs at once, at 276/256 B of spills a thread (sm_90, Triton
#: 3.6's ptxas: results/lmhead_slp_regs_offline_s29.txt); a variant until a GPU times it
#: BWD_DZ_LOW: the backward's dz scratch holds dz rounded to the operands' dtype (bf16), the values both grad kernels
#: round it to before their dots, instead of fp32: half the scratch's bytes written and read twice, and loads that
#: feed the dots as they are; the same bits (a GPU test checks). BWD_GH_BLOCK_M: grad_hidden's rows a program
#: (BWD_BLOCK_M stays grad_w's): a 1024-token chunk at hidden 1024 gives 8 x 8 = 64 programs of 128 rows on 132 SMs,
#: 128 of 64 rows; each element's sum over V is the same chain either way. BWD_STAGES: the two grad kernels'
#: pipeline depth (num_stages stays the forward's and the dz kernel's): with BLOCK_K 32 a K step is two wgmma, so
#: three stages keep only two steps' loads in flight. Why: H100, qwen3-0.6b's 4 minibatch updates, grad_hidden 2.2 ms
#: and grad_w 2.2 ms a 1024-token chunk, ~145 TFLOP/s, where the dz kernel ran at ~400
#: (results/train_profile_h100_qwen3-0.6b_s23_fused.md); compiled for sm_90 every variant pipelines its loads and
#: none spills (results/lmhead_bwd_ptx_offline_s29.txt). BWD_DZ_LOW on by default: H100, one run at hidden 4096,
#: forward + backward 2.058x eager's time at 1024 tokens against 2.530x with the fp32 scratch, 2.229x against 2.697x
#: at 4096; 64-row grad_hidden tiles were slower (2.764x, 2.966x), 5 stages about the same (2.494x, 2.511x)
#: (`benchmarks/gpu_pending.sh lmhead_bwd`, results/speed_h100_ops_variants_s30.md).
#: BWD_GW_HFAST: grad_w's grid with the H tiles of a V tile side by side (its program ids swapped), so the tiles that
#: read the same dz columns run at once and the scratch comes from HBM about once instead of once per H tile (a
#: 1024-token chunk of qwen3's dz is 311 MB in bf16, far over the 50 MB L2); who computes a tile, never its sum.
#: BWD_CHUNK_T: tokens a dz scratch holds; grad_w's chain over the tokens runs on through an fp32 buffer from one
#: chunk to the next in the same K steps (chunks are multiples of BWD_BLOCK_K), and grad_hidden's rows are their
#: own, so the chunk moves no bits: at 4096 a qwen3-0.6b minibatch (~3700 answer tokens) is one chunk, grad_hidden
#: 232 programs instead of 64 a launch and grad_w one pass over the weight's fp32 buffer instead of four.
#: Both on by default: H100, one run, forward + backward at qwen3-0.6b's lm_head (hidden 1024) over 3680 tokens
#: 0.818x eager's time with both against 1.438x with neither (0.882x chunks of 4096 alone, 1.342x HFAST alone), at
#: hidden 4096 1.906x against 2.110x at 1024 tokens and 1.761x against 2.218x at 4096; bits the same
#: (`benchmarks/gpu_pending.sh lmhead_bwd2`, results/speed_h100_ops_variants_s30_bwd2.md). A scratch of 4096 tokens
#: is 1.24 GB at qwen3's V in bf16.
#: FWD_ENTROPY (not a tunable: the contract's entry, `logprob`, never reads it): a trainer that logs the entropy of
#: its log-probs' softmax (e2e's grpo_step) gets both from one pass over the lm_head (`logprob_entropy`, the backend's
#: choice where this is 1) instead of logprob's pass and entropy's: the entropy's chunk partials beside the
#: log-sum-exp's on the same tiles, entropy.py's merge beside logprob's. The log-probs keep their bits (their code is
#: the same; the entropy's is added beside it), and the entropy is entropy.py's where the two CONFIGs tile the logits
#: alike (CPU and GPU tests). H100, qwen3-0.6b, 4 minibatch updates: a pass 0.455 s with it against 0.466 with
#: entropy's own forward (results/train_profile_h100_qwen3-0.6b_s31_variants.md). On since session 32, when its GPU
#: bit test passed (results/pytest_gpu_h100_s32_logprob_entropy.log) with both kernels running one tile update
#: (entropy._ent_tile) and one chunk merge (entropy._ent_merge); session 31's copies of them gave the entropy other
#: last bits (results/pytest_gpu_h100_s31_logprob_entropy_red.log, results/pytest_gpu_h100_s32_suite.log).
#: FWD_ENT_MAXNREG: that launch's register cap. Compiled for sm_90 (Triton 3.6, a real launch's alignment) the forward
#: takes 127 registers a thread without the entropy, two 8-warp programs an SM, and 154 with it, one; capped at 128
#: it spills nothing and two fit again (`benchmarks/lmhead_ptx_offline.py`, results/lmhead_ptx_offline_s30.txt).
#: MERGE_STAGES: the combine kernels' loop over the V chunks software-pipelined in this many stages (`tl.range`'s
#: num_stages: the loads of the next chunks go out, as async copies, while one chunk merges): the same merges in the
#: same order, so no bit changes, where the plain loop paid a global-memory round trip or two per chunk. A decode
#: batch's combine is one program walking V / V_CHUNK chunks (297 for qwen3's lm_head) in one chain; the one-pass
#: combine's loop, compiled for sm_90 by the GPU's Triton (3.6), issued its five loads a chunk between its merge's
#: exps, and with 8 stages 82 async copies (`benchmarks/lmhead_ptx_offline.py`, results/lmhead_ptx_offline_s25.txt).
#: H100, decode batch of 64, one run: sample_logprob 256.5 us with 8 stages, 262.4 with 4, 320.4 with 2, 467.8 with
#: the plain loop; logprob alone 163.7 against 170.3 (`benchmarks/bench_lmhead_decode.py --only MERGE`,
#: results/lmhead_decode_h100_s25.json)
CONFIG = {
    "BLOCK_T": 64,
    "BLOCK_V": 128,
    "BLOCK_K": 64,
    "V_CHUNK": 512,
    "num_warps": 8,
    "num_stages": 3,
    "BWD_CHUNK_T": 4096,
    "BWD_BLOCK_M": 128,
    "BWD_BLOCK_N": 128,
    "BWD_BLOCK_K": 32,
    "BWD_GH_BLOCK_M": 128,
    "BWD_DZ_LOW": 1,
    "BWD_GW_HFAST": 1,
    "BWD_STAGES": 3,
    "PDL": 1,
    "CHUNKS": 1,
    "MERGE_STAGES": 8,
    "FLAT": 1,
    "SLP_STAGES": 4,
    "SLP_MAXNREG": 128,
    "FWD_ENTROPY": 1,
    "FWD_ENT_MAXNREG": 128,
}


@triton.jit
def _lse_step(b_m, b_s, b_z):
    """A [BT, BV] logits tile (-inf where masked) into the running (max, Σ exp(z - max)) of each row."""
    b_new = tl.maximum(b_m, tl.max(b_z, axis=1))
    return b_new, b_s * tl.exp(b_m - b_new) + tl.sum(tl.exp(b_z - b_new[:, None]), axis=1)


@triton.jit
def _lse_merge(b_m, b_s, c_m, c_s):
    """A chunk's (max, Σ exp) into the running one. The sum of two products is written as the one multiply-add the
    compiler made of it (the running sum's product fused): LLVM picks which product of `a * b + c * d` to fuse from the
    code around it, and logprob's and sample_logprob's combines must agree bit for bit (rope's rotation once did
    not)."""
    b_new = tl.maximum(b_m, c_m)
    return b_new, tl.fma(b_s, tl.exp(b_m - b_new), c_s * tl.exp(c_m - b_new))


@triton.jit
def _logprob_chunk(h_ptr, w_ptr, m_part_ptr, s_part_ptr, zt_ptr, a_part_ptr, o_t, m_t, b_tgt, pid_c, NC, T, V, H,
                   stride_h, stride_w, temperature, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                   BLOCK_K: tl.constexpr, V_CHUNK: tl.constexpr, WITH_ENT: tl.constexpr):
    """V chunk `pid_c` of a token block: its (max, Σ exp(z - max)) from a fresh state and, where it holds a token's
    target, that target's logit, stored at the chunk's slot. A chunk past the last (pid_c >= NC) stores nothing.
    WITH_ENT: also entropy.py's a = Σ e^(z - max)·(z - max) of the chunk (`entropy._ent_tile`), for the entropy."""
    b_m = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    b_s = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_zt = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_a = tl.zeros([BLOCK_T], dtype=tl.float32)
    v_start = pid_c * V_CHUNK
    v_end = tl.minimum(v_start + V_CHUNK, V)
    # tiles in increasing v; the chunk's first tile always holds a valid entry, so b_m is finite after it
    for v0 in range(v_start, v_end, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_v = o_v < v_end
        b_z = _logits_tile(h_ptr, w_ptr, o_t, m_t, o_v, m_v, H, stride_h, stride_w, temperature,
                           BLOCK_T, BLOCK_V, BLOCK_K)
        b_z = tl.where(m_v[None, :], b_z, float("-inf"))  # [BT, BV]
        if WITH_ENT:  # entropy.py's tile update: its (max, Σ exp) are `_lse_step`'s values, with a beside
            b_m, b_s, b_a = _ent_tile(b_m, b_s, b_a, b_z, m_v)
        else:
            b_m, b_s = _lse_step(b_m, b_s, b_z)
        # one entry at most matches: a sum of it and exact zeros is exact
        b_zt += tl.sum(tl.where(o_v[None, :] == b_tgt[:, None], b_z, 0.0), axis=1)
    m_c = m_t & (pid_c < NC)  # a chunk past the last stores nothing
    tl.store(m_part_ptr + pid_c * T + o_t, b_m, mask=m_c)
    tl.store(s_part_ptr + pid_c * T + o_t, b_s, mask=m_c)
    if WITH_ENT:
        tl.store(a_part_ptr + pid_c * T + o_t, b_a, mask=m_c)
    in_chunk = (b_tgt >= v_start) & (b_tgt < v_end)
    tl.store(zt_ptr + o_t, b_zt, mask=m_c & in_chunk)


@triton.jit
def _logprob_fwd_kernel(
    h_ptr,  # [T, H] hidden (row stride stride_h, unit column stride)
    w_ptr,  # [V, H] lm_head weight (row stride stride_w)
    tgt_ptr,  # [T] int64 target ids
    m_part_ptr,  # [NC, T] fp32 running max of each V chunk
    s_part_ptr,  # [NC, T] fp32 Σ exp(z - max) of each V chunk
    zt_ptr,  # [T] fp32 the target's logit, written by the chunk that holds it
    a_part_ptr,  # [NC, T] fp32 Σ exp(z - max)·(z - max) of each V chunk (WITH_ENT; else unused)
    T,
    V,
    H,
    stride_h,
    stride_w,
    temperature,
    NC,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    V_CHUNK: tl.constexpr,
    CHUNKS: tl.constexpr = 1,  # V chunks per program, each from a fresh state: who computes a chunk, not its sum
    WITH_ENT: tl.constexpr = False,  # the entropy's chunk partials too (`logprob_entropy`)
):
    pid_t = tl.program_id(0).to(tl.int64)
    pid_g = tl.program_id(1).to(tl.int64)
    o_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < T
    b_tgt = tl.load(tgt_ptr + o_t, mask=m_t, other=-1)
    for j in range(CHUNKS):
        _logprob_chunk(h_ptr, w_ptr, m_part_ptr, s_part_ptr, zt_ptr, a_part_ptr, o_t, m_t, b_tgt, pid_g * CHUNKS + j,
                       NC, T, V, H, stride_h, stride_w, temperature, BLOCK_T, BLOCK_V, BLOCK_K, V_CHUNK, WITH_ENT)


@triton.jit
def _logprob_combine_kernel(
    m_part_ptr,  # [NC, T] fp32 chunk maxima
    s_part_ptr,  # [NC, T] fp32 chunk sums
    zt_ptr,  # [T] fp32 target logits (-inf for a target outside [0, V))
    out_ptr,  # [T] fp32 log-probabilities
    lse_ptr,  # [T] fp32 log Σ exp(z), saved for backward
    a_part_ptr,  # [NC, T] fp32 chunk Σ e^(z-m)(z-m) (WITH_ENT; else unused)
    ent_ptr,  # [T] fp32 entropy (WITH_ENT; else unused)
    T,
    NC,
    BLOCK: tl.constexpr,
    MERGE_STAGES: tl.constexpr = 1,  # the chunk loop's loads pipelined: the same merges in the same order
    WITH_ENT: tl.constexpr = False,  # also entropy.py's merge of (max, Σ exp, a) and its H = log s - a / s
):
    pid = tl.program_id(0).to(tl.int64)
    o_t = pid * BLOCK + tl.arange(0, BLOCK)
    m_t = o_t < T
    b_m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    b_s = tl.zeros([BLOCK], dtype=tl.float32)
    e_m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    e_s = tl.zeros([BLOCK], dtype=tl.float32)
    e_a = tl.zeros([BLOCK], dtype=tl.float32)
    # chunks in increasing order: the merge order is fixed by V and V_CHUNK
    for c in tl.range(0, NC, num_stages=MERGE_STAGES):
        c_m = tl.load(m_part_ptr + c * T + o_t, mask=m_t, other=0.0)
        c_s = tl.load(s_part_ptr + c * T + o_t, mask=m_t, other=0.0)
        b_m, b_s = _lse_merge(b_m, b_s, c_m, c_s)
        if WITH_ENT:  # entropy.py's merge beside (its own running sum: its formula, its bits)
            c_a = tl.load(a_part_ptr + c * T + o_t, mask=m_t, other=0.0)
            e_m, e_s, e_a = _ent_merge(e_m, e_s, e_a, c_m, c_s, c_a)
    # masked rows have b_s = 0: keep log() finite there (never stored)
    b_lse = b_m + tl.log(tl.where(m_t, b_s, 1.0))
    b_zt = tl.load(zt_ptr + o_t, mask=m_t, other=0.0)
    tl.store(out_ptr + o_t, b_zt - b_lse, mask=m_t)
    tl.store(lse_ptr + o_t, b_lse, mask=m_t)
    if WITH_ENT:
        e_s = tl.where(m_t, e_s, 1.0)
        tl.store(ent_ptr + o_t, tl.log(e_s) - e_a / e_s, mask=m_t)


@triton.jit
def _logprob_bwd_dz_kernel(
    h_ptr,  # [n, H] hidden rows of this token chunk
    w_ptr,  # [V, H] lm_head weight
    tgt_ptr,  # [n] int64 targets
    lse_ptr,  # [n] fp32 saved log Σ exp(z)
    g_ptr,  # [n] fp32 upstream gradient
    dz_ptr,  # [n, V] gradient w.r.t. the un-tempered logits (hidden @ w.T): fp32, or w's dtype (BWD_DZ_LOW)
    n,
    V,
    H,
    stride_h,
    stride_w,
    temperature,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_t = tl.program_id(0).to(tl.int64)
    pid_v = tl.program_id(1).to(tl.int64)
    o_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_t = o_t < n
    m_v = o_v < V
    b_z = _logits_tile(h_ptr, w_ptr, o_t, m_t, o_v, m_v, H, stride_h, stride_w, temperature,
                       BLOCK_T, BLOCK_V, BLOCK_K)
    b_lse = tl.load(lse_ptr + o_t, mask=m_t, other=0.0)
    b_g = tl.load(g_ptr + o_t, mask=m_t, other=0.0)
    b_tgt = tl.load(tgt_ptr + o_t, mask=m_t, other=-1)
    b_p = tl.exp(b_z - b_lse[:, None])
    b_hit = (o_v[None, :] == b_tgt[:, None]).to(tl.float32)
    b_dz = b_g[:, None] * (b_hit - b_p) / temperature
    # fp32, or (BWD_DZ_LOW) already rounded as the grad kernels round it for their dots
    tl.store(dz_ptr + o_t[:, None] * V + o_v[None, :], round_to(b_dz, dz_ptr.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


def logprob_fwd(hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                temperature: float, with_entropy: bool = False):
    """(logprob[T], lse[T], entropy[T] or None) for hidden[T, H], all fp32: with_entropy, the entropy from the same
    logits tiles (entropy.py's partials and merge, beside)."""
    T, H = hidden.shape
    V = w.shape[0]
    cfg = CONFIG
    out = torch.empty((T,), dtype=torch.float32, device=hidden.device)
    lse = torch.empty((T,), dtype=torch.float32, device=hidden.device)
    ent = torch.empty((T,), dtype=torch.float32, device=hidden.device) if with_entropy else None
    if T == 0:
        return out, lse, ent
    n_chunks = triton.cdiv(V, cfg["V_CHUNK"])
    m_part = torch.empty((n_chunks, T), dtype=torch.float32, device=hidden.device)
    s_part = torch.empty((n_chunks, T), dtype=torch.float32, device=hidden.device)
    a_part = torch.empty((n_chunks, T), dtype=torch.float32, device=hidden.device) if with_entropy else m_part
    z_tgt = torch.full((T,), float("-inf"), dtype=torch.float32, device=hidden.device)
    chunks = cfg.get("CHUNKS", 1)
    _logprob_fwd_kernel[(triton.cdiv(T, cfg["BLOCK_T"]), triton.cdiv(n_chunks, chunks))](
        hidden, w, targets, m_part, s_part, z_tgt, a_part, T, V, H, hidden.stride(0), w.stride(0), float(temperature),
        n_chunks, BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"], V_CHUNK=cfg["V_CHUNK"],
        CHUNKS=chunks, WITH_ENT=with_entropy, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **(maxnreg_launch(cfg.get("FWD_ENT_MAXNREG", 0)) if with_entropy else {}),
    )
    _logprob_combine_kernel[(triton.cdiv(T, 128),)](m_part, s_part, z_tgt, out, lse, a_part,
                                                     ent if with_entropy else out, T, n_chunks, BLOCK=128,
                                                     MERGE_STAGES=cfg.get("MERGE_STAGES", 1), WITH_ENT=with_entropy)
    return out, lse, ent


def logprob_bwd(g: torch.Tensor, hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                temperature: float, need_hidden: bool, need_w: bool):
    T, H = hidden.shape
    V = w.shape[0]
    cfg = CONFIG
    g = g.reshape(T).float().contiguous()
    grad_h = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_hidden else None
    gw_acc = torch.zeros((V, H), dtype=torch.float32, device=w.device) if need_w else None
    chunk = cfg["BWD_CHUNK_T"]
    # the scratch holds dz as the grad kernels' dots take it: rounded to the operands' dtype (BWD_DZ_LOW, where
    # hidden and w share it), else fp32 and rounded in each grad kernel; the same values either way
    low = cfg.get("BWD_DZ_LOW", 0) and hidden.dtype == w.dtype
    dz = torch.empty((min(chunk, T), V), dtype=w.dtype if low else torch.float32, device=hidden.device) if T else None
    for t0 in range(0, T, chunk):
        n = min(chunk, T - t0)
        h_c = hidden[t0 : t0 + n]
        _logprob_bwd_dz_kernel[(triton.cdiv(n, cfg["BLOCK_T"]), triton.cdiv(V, cfg["BLOCK_V"]))](
            h_c, w, targets[t0 : t0 + n], lse[t0 : t0 + n], g[t0 : t0 + n], dz, n, V, H,
            hidden.stride(0), w.stride(0), float(temperature),
            BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"],
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        grads(cfg, dz, w, h_c, t0 == 0, grad_h[t0 : t0 + n] if need_hidden else None, gw_acc)
    return grad_h, (gw_acc.to(w.dtype) if need_w else None)


class LogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float):
        out, lse, _ = logprob_fwd(hidden, w, targets, temperature)
        ctx.save_for_backward(hidden, w, targets, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        hidden, w, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h, grad_w = logprob_bwd(g, hidden, w, targets, lse, ctx.temperature, need_h, need_w)
        return grad_h, grad_w, None, None


class LogprobEntropyFunction(torch.autograd.Function):
    """LogprobFunction's forward with the entropy of the same logits beside, as a logged figure: no gradient flows
    through the entropy (mark_non_differentiable); the log-probs' backward is LogprobFunction's."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float):
        out, lse, ent = logprob_fwd(hidden, w, targets, temperature, with_entropy=True)
        ctx.save_for_backward(hidden, w, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, g: torch.Tensor, g_ent: torch.Tensor | None):
        return LogprobFunction.backward(ctx, g)


def _entry(name: str, hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float):
    """(leading dims, hidden rows [T, H], w, int64 targets [T]) checked as `logprob` takes them."""
    if not temperature > 0:
        raise ValueError(f"{name}: temperature must be > 0, got {temperature}")
    H = hidden.shape[-1]
    if w.dim() != 2 or w.shape[1] != H:
        raise ValueError(f"{name}: weight shape {tuple(w.shape)} does not match hidden size {H}")
    h2 = _rows(hidden.reshape(-1, H))
    t = targets.reshape(-1).to(torch.int64).contiguous()
    if t.shape[0] != h2.shape[0]:
        raise ValueError(f"{name}: {t.shape[0]} targets for {h2.shape[0]} tokens")
    return hidden.shape[:-1], h2, _rows(w), t


def logprob(hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(hidden @ w.T / temperature)[t, targets[t]] in fp32; leading dims of hidden are token dims.

    A target outside [0, V) gives -inf. temperature must be > 0.
    """
    lead, h2, w2, t = _entry("logprob", hidden, w, targets, temperature)
    return LogprobFunction.apply(h2, w2, t, float(temperature)).reshape(lead)


def logprob_entropy(hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                    temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy) of the same logits from one pass over the lm_head: `logprob`'s log-probs, bit for bit, with
    their gradient, and the softmax entropy as `entropy.entropy` computes it (its chunk partials and merge, the same
    tiles: the same bits where entropy's CONFIG tiles the logits as this one does), without a gradient: the figure
    a trainer logs, for one lm_head pass an update instead of two."""
    lead, h2, w2, t = _entry("logprob_entropy", hidden, w, targets, temperature)
    out, ent = LogprobEntropyFunction.apply(h2, w2, t, float(temperature))
    return out.reshape(lead), ent.reshape(lead)


# ----------------------------------------------------------------------------- sampling and its log-prob in one pass


@triton.jit
def _sample_logprob_tile(b_z, o_v, m_v, b_key, v0, b_m, b_s, b_best, b_idx, b_zb):
    """A [BT, BV] tile of logits / temperature (from column v0) into a chunk's state: logprob's log-sum-exp and the
    sampler's race, through the helpers their own kernels use."""
    b_z = tl.where(m_v[None, :], b_z, float("-inf"))  # [BT, BV]
    b_m, b_s = _lse_step(b_m, b_s, b_z)
    b_best, b_idx, b_take, b_tile_idx = _race_step(b_best, b_idx, _race_scores(b_z, o_v, m_v, b_key, False), v0)
    # the winner's logit: one entry matches, a sum of it and exact zeros is exact (as the target's in logprob)
    b_tile_z = tl.sum(tl.where(o_v[None, :] == b_tile_idx[:, None], b_z, 0.0), axis=1)
    return b_m, b_s, b_best, b_idx, tl.where(b_take, b_tile_z, b_zb)


@triton.jit
def _sample_logprob_chunk(h_ptr, w_ptr, m_part_ptr, s_part_ptr, best_part_ptr, idx_part_ptr, zb_part_ptr, o_t, m_t,
                          b_key, pid_c, NC, T, V, H, stride_h, stride_w, temperature, BLOCK_T: tl.constexpr,
                          BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, V_CHUNK: tl.constexpr,
                          FLAT: tl.constexpr = False):
    """V chunk `pid_c` of a token block from a fresh state: logprob's (max, Σexp) and the race's (best, index, its
    logit), stored at the chunk's slot; a chunk past the last (pid_c >= NC) stores nothing.

    FLAT: one loop over the chunk's (tile, K step) pairs instead of a K loop per tile: a tile's logits are the same
    dots in the same order from a fresh accumulator, divided alike, handed to the same tile step at its last K step;
    the compiler then keeps the next tile's first loads in flight across a tile's end (a launch choice, no bits)."""
    b_m = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    b_s = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_best = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    b_idx = tl.full([BLOCK_T], V, dtype=tl.int64)
    b_zb = tl.zeros([BLOCK_T], dtype=tl.float32)
    v_start = pid_c * V_CHUNK
    v_end = tl.minimum(v_start + V_CHUNK, V)
    if FLAT:
        n_k = tl.cdiv(H, BLOCK_K)
        acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
        for i in range(0, tl.cdiv(v_end - v_start, BLOCK_V) * n_k):
            v0 = v_start + (i // n_k) * BLOCK_V
            o_v = v0 + tl.arange(0, BLOCK_V)
            m_v = o_v < v_end
            acc = _logits_step(h_ptr, w_ptr, o_t, m_t, o_v, m_v, (i % n_k) * BLOCK_K, H, stride_h, stride_w, acc,
                               BLOCK_K)
            if i % n_k == n_k - 1:
                b_m, b_s, b_best, b_idx, b_zb = _sample_logprob_tile(acc / temperature, o_v, m_v, b_key, v0, b_m,
                                                                     b_s, b_best, b_idx, b_zb)
                acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
    else:
        for v0 in range(v_start, v_end, BLOCK_V):
            o_v = v0 + tl.arange(0, BLOCK_V)
            m_v = o_v < v_end
            b_z = _logits_tile(h_ptr, w_ptr, o_t, m_t, o_v, m_v, H, stride_h, stride_w, temperature,
                               BLOCK_T, BLOCK_V, BLOCK_K)
            b_m, b_s, b_best, b_idx, b_zb = _sample_logprob_tile(b_z, o_v, m_v, b_key, v0, b_m, b_s, b_best, b_idx,
                                                                 b_zb)
    m_c = m_t & (pid_c < NC)  # a chunk past the last stores nothing
    tl.store(m_part_ptr + pid_c * T + o_t, b_m, mask=m_c)
    tl.store(s_part_ptr + pid_c * T + o_t, b_s, mask=m_c)
    tl.store(best_part_ptr + pid_c * T + o_t, b_best, mask=m_c)
    tl.store(idx_part_ptr + pid_c * T + o_t, b_idx, mask=m_c)
    tl.store(zb_part_ptr + pid_c * T + o_t, b_zb, mask=m_c)


@triton.jit
def _sample_logprob_kernel(
    h_ptr,  # [T, H] hidden
    w_ptr,  # [V, H] lm_head weight
    seed_ptr,  # [T] int64 sampling seeds
    m_part_ptr,  # [NC, T] fp32 running max of each V chunk (as _logprob_fwd_kernel)
    s_part_ptr,  # [NC, T] fp32 Σ exp(z - max) of each V chunk (as _logprob_fwd_kernel)
    best_part_ptr,  # [NC, T] fp32 best Gumbel score of each V chunk (as sample's kernel)
    idx_part_ptr,  # [NC, T] int64 its index
    zb_part_ptr,  # [NC, T] fp32 its logit
    T,
    V,
    H,
    stride_h,
    stride_w,
    temperature,
    NC,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    V_CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
    CHUNKS: tl.constexpr = 1,  # V chunks per program, each from a fresh state (as _logprob_fwd_kernel)
    FLAT: tl.constexpr = False,  # one loop over a chunk's (tile, K step) pairs (`_sample_logprob_chunk`)
):
    pdl_start(PDL)
    pid_t = tl.program_id(0).to(tl.int64)
    pid_g = tl.program_id(1).to(tl.int64)
    o_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < T
    b_seed = tl.load(seed_ptr + o_t, mask=m_t, other=0)
    b_key = _race_key(b_seed)  # [BT]
    for j in range(CHUNKS):
        _sample_logprob_chunk(h_ptr, w_ptr, m_part_ptr, s_part_ptr, best_part_ptr, idx_part_ptr, zb_part_ptr,
                              o_t, m_t, b_key, pid_g * CHUNKS + j, NC, T, V, H, stride_h, stride_w, temperature,
                              BLOCK_T, BLOCK_V, BLOCK_K, V_CHUNK, FLAT)


@triton.jit
def _sample_logprob_combine_kernel(
    m_part_ptr,
    s_part_ptr,
    best_part_ptr,
    idx_part_ptr,
    zb_part_ptr,
    ids_ptr,  # [T] int64 sampled ids
    out_ptr,  # [T] fp32 their log-probabilities
    T,
    NC,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
    MERGE_STAGES: tl.constexpr = 1,  # the chunk loop's loads pipelined: the same merges in the same order
):
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    o_t = pid * BLOCK + tl.arange(0, BLOCK)
    m_t = o_t < T
    b_m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    b_s = tl.zeros([BLOCK], dtype=tl.float32)
    b_best = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    b_idx = tl.load(idx_part_ptr + o_t, mask=m_t, other=0)
    b_zb = tl.load(zb_part_ptr + o_t, mask=m_t, other=0.0)
    # chunks in increasing order: the log-sum-exp as _logprob_combine_kernel merges it, the race as sample's
    # _sample_combine_kernel does (strictly greater wins: ties to the lowest index)
    for c in tl.range(0, NC, num_stages=MERGE_STAGES):
        c_m = tl.load(m_part_ptr + c * T + o_t, mask=m_t, other=0.0)
        c_s = tl.load(s_part_ptr + c * T + o_t, mask=m_t, other=0.0)
        b_m, b_s = _lse_merge(b_m, b_s, c_m, c_s)
        c_best = tl.load(best_part_ptr + c * T + o_t, mask=m_t, other=float("-inf"))
        c_idx = tl.load(idx_part_ptr + c * T + o_t, mask=m_t, other=0)
        b_best, b_idx, b_take = _race_merge(b_best, b_idx, c_best, c_idx)
        b_zb = tl.where(b_take, tl.load(zb_part_ptr + c * T + o_t, mask=m_t, other=0.0), b_zb)
    b_lse = b_m + tl.log(tl.where(m_t, b_s, 1.0))
    tl.store(ids_ptr + o_t, b_idx, mask=m_t)
    tl.store(out_ptr + o_t, b_zb - b_lse, mask=m_t)


@torch.no_grad()
def sample_logprob(hidden: torch.Tensor, w: torch.Tensor, temperature: float,
                   seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int64, log-probs fp32): `sample(hidden, w, temperature, seeds)` and `logprob(hidden, w, ids,
    temperature)` bit for bit, in one pass over the lm_head instead of two (a decode step's sampler and its log-prob
    read the weight once: 311 MB for Qwen3-0.6B, 622 MB for 1.7B).

    One grid of (token blocks, V chunks) with this module's CONFIG computes each logits tile once (`_logits_tile`)
    and keeps, per token, logprob's online (max, Σexp) and the sampler's race (best score, its index and its logit);
    one combine merges the chunks in increasing order as each operator's own combine does. The log-sum-exp is
    logprob's tree (its BLOCK_V and V_CHUNK), the race's result does not depend on the tiling (ties go to the lowest
    index), so the token is the sampler's whatever its CONFIG, provided the logits are: the sampler's BLOCK_K must
    be this module's (`tik_kernels/ops/sample.py` says the same of logprob). temperature must be > 0 (greedy
    decoding has no log-prob to return). Not differentiable."""
    if not temperature > 0:
        raise ValueError(f"sample_logprob: temperature must be > 0, got {temperature}")
    H = hidden.shape[-1]
    if w.dim() != 2 or w.shape[1] != H:
        raise ValueError(f"sample_logprob: weight shape {tuple(w.shape)} does not match hidden size {H}")
    lead = hidden.shape[:-1]
    h2 = _rows(hidden.reshape(-1, H)).detach()
    w2 = _rows(w.detach())
    s = seeds.reshape(-1).to(torch.int64).contiguous()
    T, V = h2.shape[0], w2.shape[0]
    if s.shape[0] != T:
        raise ValueError(f"sample_logprob: {s.shape[0]} seeds for {T} tokens")
    ids = torch.empty((T,), dtype=torch.int64, device=h2.device)
    out = torch.empty((T,), dtype=torch.float32, device=h2.device)
    if T > 0:
        cfg = CONFIG
        pdl = pdl_launch(cfg.get("PDL"), h2.device)
        nc = triton.cdiv(V, cfg["V_CHUNK"])
        parts = [torch.empty((nc, T), dtype=dt, device=h2.device)
                 for dt in (torch.float32, torch.float32, torch.float32, torch.int64, torch.float32)]
        chunks = cfg.get("CHUNKS", 1)
        _sample_logprob_kernel[(triton.cdiv(T, cfg["BLOCK_T"]), triton.cdiv(nc, chunks))](
            h2, w2, s, *parts, T, V, H, h2.stride(0), w2.stride(0), float(temperature), nc,
            BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"], V_CHUNK=cfg["V_CHUNK"],
            CHUNKS=chunks, FLAT=bool(cfg.get("FLAT", 0)), num_warps=cfg["num_warps"],
            num_stages=cfg.get("SLP_STAGES", cfg["num_stages"]), **maxnreg_launch(cfg.get("SLP_MAXNREG", 0)), **pdl,
        )
        _sample_logprob_combine_kernel[(triton.cdiv(T, 128),)](*parts, ids, out, T, nc, BLOCK=128,
                                                                MERGE_STAGES=cfg.get("MERGE_STAGES", 1), **pdl)
    return ids.reshape(lead), out.reshape(lead)
