"""Fused lm_head + temperature + softmax entropy, batch-invariant:
`entropy(hidden[T, H], w[V, H], temperature) -> fp32[T]`.

out[t] = −Σ_v p log p with p = softmax(hidden @ w.T / temperature)[t], never materializing [T, V] logits.

Invariance: a token's result depends only on its own row. The grid is (token blocks, V chunks);
BLOCK_T, BLOCK_V, BLOCK_K and V_CHUNK are fixed by CONFIG (never chosen by T). A program
computes the logits of its BLOCK_T tokens over one chunk of V_CHUNK entries, one
[BLOCK_T, BLOCK_V] tile at a time, each tile a K-sequential `tl.dot` over H in BLOCK_K steps
(no split-K), divided by the temperature in fp32 — `ops/_lmhead.py`'s `_logits_tile`, the one `logprob` and
`sample` call. Per token it keeps an online (m = max z, s = Σ e^(z−m), a = Σ e^(z−m)·(z−m)) over the
tiles in increasing v, rescaled exactly as the max moves; a second kernel merges the chunk
partials in increasing chunk order and returns H = log s − a/s (and lse = m + log s for backward).
Nothing in the order depends on T or on the other tokens.

Backward recomputes the logits tiles: dH/dz = −p (log p + H), so dz = −g·p·(z − lse + H)/temperature,
for BWD_CHUNK_T tokens at a time (a fixed [BWD_CHUNK_T, V] fp32 scratch, never [T, V]), then
grad_hidden = dz @ w and grad_w = Σ_t dz[t]ᵀ hidden[t] with logprob's K-sequential matmul kernels (`ops/_lmhead.py`,
dz rounded to the operands' dtype for their dots, in the interpreter too); grad_w accumulates the chunks in order
into an fp32 [V, H] buffer owned tile by tile (no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels.ops._lmhead import _logits_tile, _rows, grads

TUNABLES = {
    "BLOCK_T": (16, 32, 64, 128),
    "BLOCK_V": (64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "V_CHUNK": (256, 512, 1024, 2048, 4096),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
    "BWD_CHUNK_T": (256, 512, 1024, 2048),
    "BWD_BLOCK_M": (64, 128),
    "BWD_BLOCK_N": (64, 128),
    "BWD_BLOCK_K": (32, 64),
    "MERGE_STAGES": (1, 2, 4, 8),
}
#: MERGE_STAGES: the combine kernel's loop over the V chunks software-pipelined in this many stages (`tl.range`'s
#: num_stages): the loads of the next chunks go out while one merges, the same merges in the same order (as in
#: logprob.py)
CONFIG = {
    "BLOCK_T": 64,
    "BLOCK_V": 128,
    "BLOCK_K": 64,
    "V_CHUNK": 512,
    "num_warps": 8,
    "num_stages": 3,
    "BWD_CHUNK_T": 1024,
    "BWD_BLOCK_M": 128,
    "BWD_BLOCK_N": 128,
    "BWD_BLOCK_K": 32,
    "MERGE_STAGES": 8,
}


@triton.jit
def _ent_tile(b_m, b_s, b_a, b_z, m_v):
    """A [BT, BV] logits tile into each row's running (m = max z, s = Σ e^(z-m), a = Σ e^(z-m)·(z-m)), the entries
    where m_v is false left out (their logits may be anything, -inf included); also logprob's forward where it keeps
    the entropy's partials beside its log-probs (`logprob_entropy`).

    One helper for both kernels, because the bits rest on code LLVM shapes from its surroundings: b_e feeds both
    sums, so each product e·d stays a product the sum's adds fuse into multiply-adds. In a copy of this code whose
    s summed the exps before the mask, LLVM moved the mask past the product, so the products were rounded before
    the adds and the entropies differed in their last bits (H100, session 32)."""
    b_new = tl.maximum(b_m, tl.max(tl.where(m_v[None, :], b_z, float("-inf")), axis=1))
    b_d = b_z - b_new[:, None]  # [BT, BV]
    b_e = tl.where(m_v[None, :], tl.exp(b_d), 0.0)
    # a, s rescaled to the new max: e^(z-m) = α e^(z-m'), (z-m) = (z-m') + (m'-m); before any tile s = a = 0
    b_alpha = tl.exp(b_m - b_new)
    b_shift = tl.where(b_s > 0, b_m - b_new, 0.0)
    b_a = b_alpha * (b_a + b_shift * b_s) + tl.sum(b_e * tl.where(m_v[None, :], b_d, 0.0), axis=1)
    b_s = b_alpha * b_s + tl.sum(b_e, axis=1)
    return b_new, b_s, b_a


@triton.jit
def _entropy_fwd_kernel(
    h_ptr,  # [T, H] hidden (row stride stride_h, unit column stride)
    w_ptr,  # [V, H] lm_head weight (row stride stride_w)
    m_part_ptr,  # [NC, T] fp32 running max of each V chunk
    s_part_ptr,  # [NC, T] fp32 Σ exp(z - max) of each V chunk
    a_part_ptr,  # [NC, T] fp32 Σ exp(z - max)·(z - max) of each V chunk
    T,
    V,
    H,
    stride_h,
    stride_w,
    temperature,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    V_CHUNK: tl.constexpr,
):
    pid_t = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1).to(tl.int64)
    o_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < T
    b_m = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    b_s = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_a = tl.zeros([BLOCK_T], dtype=tl.float32)
    v_start = pid_c * V_CHUNK
    v_end = tl.minimum(v_start + V_CHUNK, V)
    for v0 in range(v_start, v_end, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_v = o_v < v_end
        b_z = _logits_tile(h_ptr, w_ptr, o_t, m_t, o_v, m_v, H, stride_h, stride_w, temperature,
                           BLOCK_T, BLOCK_V, BLOCK_K)
        b_m, b_s, b_a = _ent_tile(b_m, b_s, b_a, b_z, m_v)
    tl.store(m_part_ptr + pid_c * T + o_t, b_m, mask=m_t)
    tl.store(s_part_ptr + pid_c * T + o_t, b_s, mask=m_t)
    tl.store(a_part_ptr + pid_c * T + o_t, b_a, mask=m_t)


@triton.jit
def _ent_merge(b_m, b_s, b_a, c_m, c_s, c_a):
    """A chunk's (max, Σ exp(z - max), a = Σ exp(z - max)·(z - max)) into the running one, both moved to the larger
    max (before any chunk s = a = 0); also logprob's combine where it gives the entropy beside its log-probs.

    a' = α·(a + shift·s) + β·(c_a + (c_m - m')·c_s) and s' = α·s + β·c_s are each a sum of two products, which LLVM
    fuses into one multiply-add picking the product from the code around it: in logprob's combine it fused the other
    product of a' than here (H100, session 31: the entropies differed in the last bits). So the multiply-adds are
    written out, as the compiler made them in this file's combine (its sm_90 PTX the same operations on the same
    values, registers renumbered and two multiply-adds and a select in another order:
    results/ptx_entropy_combine_s31.txt)."""
    b_new = tl.maximum(b_m, c_m)
    b_alpha = tl.exp(b_m - b_new)
    b_beta = tl.exp(c_m - b_new)
    b_shift = tl.where(b_s > 0, b_m - b_new, 0.0)
    b_x = tl.fma(b_s, b_shift, b_a)
    b_y = tl.fma(c_m - b_new, c_s, c_a)
    b_a = tl.fma(b_beta, b_y, b_alpha * b_x)
    b_s = tl.fma(b_s, b_alpha, c_s * b_beta)
    return b_new, b_s, b_a


@triton.jit
def _entropy_combine_kernel(
    m_part_ptr,  # [NC, T] fp32 chunk maxima
    s_part_ptr,  # [NC, T] fp32 chunk sums
    a_part_ptr,  # [NC, T] fp32 chunk Σ e^(z-m)(z-m)
    out_ptr,  # [T] fp32 entropy
    lse_ptr,  # [T] fp32 log Σ exp(z), saved for backward
    T,
    NC,
    BLOCK: tl.constexpr,
    MERGE_STAGES: tl.constexpr = 1,  # the chunk loop's loads pipelined: the same merges in the same order
):
    pid = tl.program_id(0).to(tl.int64)
    o_t = pid * BLOCK + tl.arange(0, BLOCK)
    m_t = o_t < T
    b_m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    b_s = tl.zeros([BLOCK], dtype=tl.float32)
    b_a = tl.zeros([BLOCK], dtype=tl.float32)
    # chunks in increasing order: the merge order is fixed by V and V_CHUNK
    for c in tl.range(0, NC, num_stages=MERGE_STAGES):
        c_m = tl.load(m_part_ptr + c * T + o_t, mask=m_t, other=0.0)
        c_s = tl.load(s_part_ptr + c * T + o_t, mask=m_t, other=1.0)
        c_a = tl.load(a_part_ptr + c * T + o_t, mask=m_t, other=0.0)
        b_m, b_s, b_a = _ent_merge(b_m, b_s, b_a, c_m, c_s, c_a)
    b_ent = tl.log(b_s) - b_a / b_s
    tl.store(out_ptr + o_t, b_ent, mask=m_t)
    tl.store(lse_ptr + o_t, b_m + tl.log(b_s), mask=m_t)


@triton.jit
def _entropy_bwd_dz_kernel(
    h_ptr,  # [n, H] hidden rows of this token chunk
    w_ptr,  # [V, H] lm_head weight
    lse_ptr,  # [n] fp32 saved log Σ exp(z)
    ent_ptr,  # [n] fp32 saved entropy
    g_ptr,  # [n] fp32 upstream gradient
    dz_ptr,  # [n, V] fp32 gradient w.r.t. the un-tempered logits (hidden @ w.T)
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
    b_ent = tl.load(ent_ptr + o_t, mask=m_t, other=0.0)
    b_g = tl.load(g_ptr + o_t, mask=m_t, other=0.0)
    b_logp = b_z - b_lse[:, None]
    b_dz = -b_g[:, None] * tl.exp(b_logp) * (b_logp + b_ent[:, None]) / temperature
    tl.store(dz_ptr + o_t[:, None] * V + o_v[None, :], b_dz, mask=m_t[:, None] & m_v[None, :])


def entropy_fwd(hidden: torch.Tensor, w: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy[T], lse[T]) for hidden[T, H]; both fp32."""
    T, H = hidden.shape
    V = w.shape[0]
    cfg = CONFIG
    out = torch.empty((T,), dtype=torch.float32, device=hidden.device)
    lse = torch.empty((T,), dtype=torch.float32, device=hidden.device)
    if T == 0:
        return out, lse
    n_chunks = triton.cdiv(V, cfg["V_CHUNK"])
    parts = [torch.empty((n_chunks, T), dtype=torch.float32, device=hidden.device) for _ in range(3)]
    _entropy_fwd_kernel[(triton.cdiv(T, cfg["BLOCK_T"]), n_chunks)](
        hidden, w, *parts, T, V, H, hidden.stride(0), w.stride(0), float(temperature),
        BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"], V_CHUNK=cfg["V_CHUNK"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    _entropy_combine_kernel[(triton.cdiv(T, 128),)](*parts, out, lse, T, n_chunks, BLOCK=128,
                                                     MERGE_STAGES=cfg.get("MERGE_STAGES", 1))
    return out, lse


def entropy_bwd(g: torch.Tensor, hidden: torch.Tensor, w: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor,
                temperature: float, need_hidden: bool, need_w: bool):
    T, H = hidden.shape
    V = w.shape[0]
    cfg = CONFIG
    g = g.reshape(T).float().contiguous()
    grad_h = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_hidden else None
    gw_acc = torch.zeros((V, H), dtype=torch.float32, device=w.device) if need_w else None
    chunk = cfg["BWD_CHUNK_T"]
    dz = torch.empty((min(chunk, T), V), dtype=torch.float32, device=hidden.device) if T else None
    for t0 in range(0, T, chunk):
        n = min(chunk, T - t0)
        h_c = hidden[t0 : t0 + n]
        _entropy_bwd_dz_kernel[(triton.cdiv(n, cfg["BLOCK_T"]), triton.cdiv(V, cfg["BLOCK_V"]))](
            h_c, w, lse[t0 : t0 + n], ent[t0 : t0 + n], g[t0 : t0 + n], dz, n, V, H,
            hidden.stride(0), w.stride(0), float(temperature),
            BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"],
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        grads(cfg, dz, w, h_c, t0 == 0, grad_h[t0 : t0 + n] if need_hidden else None, gw_acc)
    return grad_h, (gw_acc.to(w.dtype) if need_w else None)


class EntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, w: torch.Tensor, temperature: float):
        out, lse = entropy_fwd(hidden, w, temperature)
        ctx.save_for_backward(hidden, w, lse, out)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        hidden, w, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h, grad_w = entropy_bwd(g, hidden, w, lse, ent, ctx.temperature, need_h, need_w)
        return grad_h, grad_w, None


def entropy(hidden: torch.Tensor, w: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(hidden @ w.T / temperature) per token, fp32; leading dims of hidden are token dims.

    temperature must be > 0.
    """
    if not temperature > 0:
        raise ValueError(f"entropy: temperature must be > 0, got {temperature}")
    H = hidden.shape[-1]
    if w.dim() != 2 or w.shape[1] != H:
        raise ValueError(f"entropy: weight shape {tuple(w.shape)} does not match hidden size {H}")
    lead = hidden.shape[:-1]
    h2 = _rows(hidden.reshape(-1, H))
    return EntropyFunction.apply(h2, _rows(w), float(temperature)).reshape(lead)
