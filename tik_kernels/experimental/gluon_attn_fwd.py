"""The attention root's Gluon forward (tik_kernels/ops/attention_gluon.py) as the experiments and benchmarks call it:
dense prefill by that kernel whatever the root's CONFIG says, in the forms the root does not launch (each step sending
for its own K and V; 128 rows a program) beside the one it does. GPU only (Hopper, Triton's Gluon); nothing imports
this module unless a GPU test or benchmark asks for it."""

from __future__ import annotations

import torch

from tik_kernels.ops import attention as root
from tik_kernels.ops import attention_gluon as g


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None):
    """What a dense launch of a Gluon forward needs, after its checks (`prefill_forward`, the warp-specialized form):
    (K's root descriptor and row strides, V's, o, lse, G, softmax scale * log2(e)). Raises ValueError where it does
    not apply."""
    B, hq, S, d = q.shape
    hk = k.shape[1]
    if d != g.HEAD_DIM or q.dtype != torch.bfloat16 or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"the Gluon forward takes bf16 and head dim {g.HEAD_DIM}, got {q.dtype} and {d}")
    if k.shape != (B, hk, S, d) or v.shape != k.shape or hq % hk:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the Gluon forward takes a unit stride on the head dim")
    kd, vd = root._kv_descriptor(k, False, g.BLOCK_N), root._kv_descriptor(v, False, g.BLOCK_N)
    if kd is None or vd is None:
        raise ValueError("K or V cannot be read through a TMA descriptor")
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    return kd, vd, o, lse, hq // hk, root._scale(scale, d) * root._LOG2E


def prefill_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                    prefetch: bool = True, block_m: int = g.BLOCK_M):
    """(o, lse) of dense causal GQA prefill, q [B, Hq, S, 128], k / v [B, Hk, S, 128], bf16 on a Hopper GPU, by
    the root's Gluon kernel whatever the root's CONFIG says, with `attention_gluon.launch`'s prefetch and block_m.
    Raises ValueError where it does not apply (`launch` checks block_m)."""
    kd, vd, o, lse, G, qk_scale = _prepare(q, k, v, scale)
    B, hk, S = q.shape[0], k.shape[1], q.shape[2]
    strides = tuple(x for t in (q, k, v, o, lse) for x in root._row_strides(t, False))
    cu = torch.zeros(1, dtype=torch.int32, device=q.device)
    g.launch(q, k, v, o, lse, cu, kd, vd, strides, S, B, S, hk, G, qk_scale, False, prefetch, block_m)
    return o, lse
