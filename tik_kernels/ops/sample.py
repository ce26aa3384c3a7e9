"""Fused lm_head + seeded Gumbel-max sampling, batch-invariant:
`sample(hidden[T, H], w[V, H], temperature, seeds[T]) -> int64 ids[T]`.

ids[t] = argmax_v (z[t, v] + g(seeds[t], v)), z = hidden @ w.T / temperature in fp32, ties to the
lowest v; temperature 0 is greedy: argmax_v of hidden @ w.T, no noise. g is standard Gumbel noise
from a counter-based hash of (seed, v) computed in the kernel — the function is specified in
`tik_kernels/reference/sample.py` and must be reproduced bit for bit — so a token's noise depends on
its seed and v only: the same seed gives the same token whatever T, order or batch composition.

Invariance: the grid is (token blocks, V chunks) with BLOCK_T, BLOCK_V, BLOCK_K and V_CHUNK fixed
by CONFIG (never chosen by T). The logits tile is the one `logprob` and `entropy` call (`ops/_lmhead.py`: a
K-sequential `tl.dot` over H in BLOCK_K steps, then `/ temperature`), so a sampled token's
logprob() is computed from the very logit the sampler used. Each program scans its chunk's tiles
in increasing v and keeps (best score, index), replacing it only on a strictly greater score;
`tl.argmax` inside a tile returns the lowest index of the maximum; a second kernel merges the
chunks in increasing order the same way. A NaN score never wins. Not differentiable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import sm_count
from tik_kernels.ops._lmhead import _logits_tile, _rows

TUNABLES = {
    "BLOCK_T": (16, 32, 64, 128),
    "BLOCK_V": (64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "V_CHUNK": (256, 512, 1024, 2048, 4096),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
    "CHUNKS": (1, 2, 4),
    "V_WAVES": (0, 1, 2, 3, 4),
    "MERGE_STAGES": (1, 2, 4, 8),
}
#: V_CHUNK 1024 (was 512): the token is an argmax with ties to the lowest index, the same under any chunking, so this
#: moves no bits; at a decode batch of 64 over qwen3's 151936-entry lm_head on an H100, 167 us against 191 (2048: 221,
#: 4096: 391; benchmarks/bench_lmhead_decode.py, results/lmhead_decode_h100_s21.json)
#: CHUNKS: V chunks one program walks in turn (each stored in its own slot): fewer, longer programs, the same token
#: V_WAVES: w > 0 sizes the V chunks for whole waves instead of V_CHUNK: the fewest BLOCK_V tiles a chunk that give at
#: most w x (number of SMs) programs over the launch's token blocks (qwen3's 151936 entries on 132 SMs, one token
#: block: chunks of 1152, 132 programs, against V_CHUNK 1024's 149, a second wave of 17). The token is the same: a
#: chunk is whole BLOCK_V tiles, whose logits are the same code, and the race's order does not matter. Off (0) until
#: timed (`bench_lmhead_decode.py`'s "sample V_WAVES" rows)
#: MERGE_STAGES: the combine kernel's loop over the V chunks software-pipelined in this many stages (`tl.range`'s
#: num_stages): the loads of the next chunks go out while one merges, the same merges in the same order (as in
#: logprob.py)
CONFIG = {"BLOCK_T": 64, "BLOCK_V": 128, "BLOCK_K": 64, "V_CHUNK": 1024, "num_warps": 8, "num_stages": 3, "CHUNKS": 1,
          "V_WAVES": 0, "MERGE_STAGES": 8}


@triton.jit
def _fmix32(x):
    """murmur3's 32-bit finalizer on uint32 (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _race_key(b_seed):
    """The per-token key of the noise hash (tik_kernels/reference/sample.py: key(s)), from int64 seeds."""
    return _fmix32(b_seed.to(tl.uint32) + _fmix32((b_seed >> 32).to(tl.uint32) ^ 0x6A09E667))


@triton.jit
def _race_scores(b_z, o_v, m_v, b_key, GREEDY: tl.constexpr):
    """[BT, BV] scores of a logits tile: z plus the Gumbel noise of (key, v) (z alone when GREEDY), -inf past the
    chunk's end and for NaN, so a NaN score never wins."""
    if not GREEDY:
        b_x = _fmix32(o_v.to(tl.uint32)[None, :] * 0x9E3779B1 + b_key[:, None])
        b_x = _fmix32(b_x ^ b_key[:, None])  # [BT, BV] uint32
        # (2k + 1)·2^-24 with k < 2^23: exact in fp32, strictly inside (0, 1)
        b_u = ((b_x >> 9).to(tl.float32) * 2.0 + 1.0) * 5.9604644775390625e-08
        b_z = b_z - tl.log(-tl.log(b_u))
    return tl.where(m_v[None, :] & (b_z == b_z), b_z, float("-inf"))


@triton.jit
def _race_step(b_best, b_idx, b_g, v0):
    """One tile of scores `b_g` (from column v0) into the running (best, index): (best, index, taken, the tile's
    index). Strictly greater replaces, so an earlier (lower-index) tile keeps a tie; `tl.argmax` within a tile
    returns the lowest index of its maximum."""
    b_tile_best = tl.max(b_g, axis=1)
    b_tile_idx = v0 + tl.argmax(b_g, axis=1).to(tl.int64)
    b_take = b_tile_best > b_best
    return tl.where(b_take, b_tile_best, b_best), tl.where(b_take, b_tile_idx, b_idx), b_take, b_tile_idx


@triton.jit
def _race_merge(b_best, b_idx, c_best, c_idx):
    """A chunk's (best, index) into the running one, strictly greater winning: (best, index, taken)."""
    b_take = c_best > b_best
    return tl.where(b_take, c_best, b_best), tl.where(b_take, c_idx, b_idx), b_take


@triton.jit
def _sample_chunk(h_ptr, w_ptr, best_part_ptr, idx_part_ptr, o_t, m_t, b_key, pid_c, NC, T, V, H, stride_h, stride_w,
                  temperature, GREEDY: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                  BLOCK_K: tl.constexpr, V_CHUNK: tl.constexpr):
    """V chunk `pid_c` of a token block: its (best score, index) from a fresh state, stored at the chunk's slot; a
    chunk past the last (pid_c >= NC) stores nothing."""
    b_best = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    b_idx = tl.full([BLOCK_T], V, dtype=tl.int64)
    v_start = pid_c * V_CHUNK
    v_end = tl.minimum(v_start + V_CHUNK, V)
    for v0 in range(v_start, v_end, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_v = o_v < v_end
        b_z = _logits_tile(h_ptr, w_ptr, o_t, m_t, o_v, m_v, H, stride_h, stride_w, temperature,
                           BLOCK_T, BLOCK_V, BLOCK_K)
        b_best, b_idx, _, _ = _race_step(b_best, b_idx, _race_scores(b_z, o_v, m_v, b_key, GREEDY), v0)
    m_c = m_t & (pid_c < NC)  # a chunk past the last stores nothing
    tl.store(best_part_ptr + pid_c * T + o_t, b_best, mask=m_c)
    tl.store(idx_part_ptr + pid_c * T + o_t, b_idx, mask=m_c)


@triton.jit
def _sample_fwd_kernel(
    h_ptr,  # [T, H] hidden (row stride stride_h, unit column stride)
    w_ptr,  # [V, H] lm_head weight (row stride stride_w)
    seed_ptr,  # [T] int64 seeds
    best_part_ptr,  # [NC, T] fp32 best score of each V chunk
    idx_part_ptr,  # [NC, T] int64 its index
    T,
    V,
    H,
    stride_h,
    stride_w,
    temperature,
    NC,
    GREEDY: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    V_CHUNK: tl.constexpr,
    CHUNKS: tl.constexpr = 1,  # V chunks per program, one after another: who computes a chunk, not its result
):
    pid_t = tl.program_id(0).to(tl.int64)
    pid_g = tl.program_id(1).to(tl.int64)
    o_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < T
    b_seed = tl.load(seed_ptr + o_t, mask=m_t, other=0)
    b_key = _race_key(b_seed)  # [BT]
    for j in range(CHUNKS):
        _sample_chunk(h_ptr, w_ptr, best_part_ptr, idx_part_ptr, o_t, m_t, b_key, pid_g * CHUNKS + j, NC, T, V,
                      H, stride_h, stride_w, temperature, GREEDY, BLOCK_T, BLOCK_V, BLOCK_K, V_CHUNK)


@triton.jit
def _sample_combine_kernel(
    best_part_ptr,  # [NC, T] fp32 chunk best scores
    idx_part_ptr,  # [NC, T] int64 their indices
    out_ptr,  # [T] int64 sampled ids
    T,
    NC,
    BLOCK: tl.constexpr,
    MERGE_STAGES: tl.constexpr = 1,  # the chunk loop's loads pipelined: the same merges in the same order
):
    pid = tl.program_id(0).to(tl.int64)
    o_t = pid * BLOCK + tl.arange(0, BLOCK)
    m_t = o_t < T
    b_best = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    b_idx = tl.load(idx_part_ptr + o_t, mask=m_t, other=0)
    # chunks in increasing order, strictly greater wins: ties go to the lowest index
    for c in tl.range(0, NC, num_stages=MERGE_STAGES):
        c_best = tl.load(best_part_ptr + c * T + o_t, mask=m_t, other=float("-inf"))
        c_idx = tl.load(idx_part_ptr + c * T + o_t, mask=m_t, other=0)
        b_best, b_idx, _ = _race_merge(b_best, b_idx, c_best, c_idx)
    tl.store(out_ptr + o_t, b_idx, mask=m_t)


def _v_chunk(V: int, T: int, device: torch.device) -> int:
    """The vocabulary entries a program scans: V_CHUNK, or with V_WAVES > 0 the fewest whole BLOCK_V tiles that keep
    the programs (token blocks x chunks, before CHUNKS) within V_WAVES waves of the device's SMs."""
    waves, block_v = CONFIG.get("V_WAVES", 0), CONFIG["BLOCK_V"]
    if not waves:
        return CONFIG["V_CHUNK"]
    per_block = max(1, waves * sm_count(device) // triton.cdiv(T, CONFIG["BLOCK_T"]))
    return triton.cdiv(triton.cdiv(V, per_block), block_v) * block_v


def sample_fwd(hidden: torch.Tensor, w: torch.Tensor, temperature: float, seeds: torch.Tensor) -> torch.Tensor:
    T, H = hidden.shape
    V = w.shape[0]
    cfg = CONFIG
    out = torch.empty((T,), dtype=torch.int64, device=hidden.device)
    if T == 0:
        return out
    v_chunk = _v_chunk(V, T, hidden.device)
    n_chunks = triton.cdiv(V, v_chunk)
    best = torch.empty((n_chunks, T), dtype=torch.float32, device=hidden.device)
    idx = torch.empty((n_chunks, T), dtype=torch.int64, device=hidden.device)
    greedy = temperature == 0
    chunks = cfg.get("CHUNKS", 1)
    _sample_fwd_kernel[(triton.cdiv(T, cfg["BLOCK_T"]), triton.cdiv(n_chunks, chunks))](
        hidden, w, seeds, best, idx, T, V, H, hidden.stride(0), w.stride(0), 1.0 if greedy else float(temperature),
        n_chunks, GREEDY=greedy, BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"],
        V_CHUNK=v_chunk, CHUNKS=chunks, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    _sample_combine_kernel[(triton.cdiv(T, 128),)](best, idx, out, T, n_chunks, BLOCK=128,
                                                    MERGE_STAGES=cfg.get("MERGE_STAGES", 1))
    return out


@torch.no_grad()
def sample(hidden: torch.Tensor, w: torch.Tensor, temperature: float, seeds: torch.Tensor) -> torch.Tensor:
    """Token ids int64 drawn from softmax(hidden @ w.T / temperature), one per token, by seeded Gumbel-max.

    seeds[t] (int64) fixes token t's noise; temperature 0 is greedy argmax (seeds unused).
    Leading dims of hidden are token dims.
    """
    if not temperature >= 0:
        raise ValueError(f"sample: temperature must be >= 0, got {temperature}")
    H = hidden.shape[-1]
    if w.dim() != 2 or w.shape[1] != H:
        raise ValueError(f"sample: weight shape {tuple(w.shape)} does not match hidden size {H}")
    lead = hidden.shape[:-1]
    h2 = _rows(hidden.reshape(-1, H))
    s = seeds.reshape(-1).to(torch.int64).contiguous()
    if s.shape[0] != h2.shape[0]:
        raise ValueError(f"sample: {s.shape[0]} seeds for {h2.shape[0]} tokens")
    return sample_fwd(h2.detach(), _rows(w.detach()), float(temperature), s).reshape(lead)
