"""Float64 references for causal GQA attention (frozen oracle; plain torch, differentiable)."""

from __future__ import annotations

import math

import torch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, M, D], k/v [Hk, N, D], keep [M, N] bool -> [Hq, M, D] in float64."""
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    s = torch.einsum("hmd,hnd->hmn", q.double(), k.double()) * scale
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hmn,hnd->hmd", torch.softmax(s, -1), v.double())


def _scale(scale: float | None, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def attention_prefill(q, k, v, scale=None, rows=None):
    """Causal attention of q [B, Hq, S, D] over k/v [B, Hk, S, D]; only query positions `rows` when given."""
    S, d = q.shape[2], q.shape[3]
    rows = torch.arange(S) if rows is None else torch.as_tensor(rows)
    keep = torch.arange(S)[None, :] <= rows[:, None]
    return torch.stack([_attend(q[b][:, rows], k[b], v[b], keep, _scale(scale, d)) for b in range(q.shape[0])])


def attention_decode(q, k_cache, v_cache, lens, scale=None):
    """q [B, Hq, 1, D] against the first lens[b] keys of k/v caches [B, Hk, L, D]."""
    outs = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        keep = torch.ones(1, n, dtype=torch.bool)
        outs.append(_attend(q[b], k_cache[b, :, :n], v_cache[b, :, :n], keep, _scale(scale, q.shape[-1])))
    return torch.stack(outs)


def attention_varlen(q, k, v, cu_seqlens, scale=None):
    """Causal attention over packed sequences q [T, Hq, D], k/v [T, Hk, D] split at cu_seqlens."""
    cu = [int(c) for c in cu_seqlens]
    outs = []
    for s, e in zip(cu[:-1], cu[1:], strict=True):
        keep = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        o = _attend(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), keep,
                    _scale(scale, q.shape[-1]))
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)
