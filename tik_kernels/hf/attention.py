"""TIK's attention as a transformers attention function, registered as `"tik"` in `AttentionInterface`.

Called by the patched attention modules with HF's layout: query [B, Hq, S, D], key/value [B, Hk, L, D]
(L = past + S: the DynamicCache's keys after this step's update), and the forward's `TikBatch`.
Returns ([B, S, Hq, D], None) like every HF attention function.

* L == S, no padding: `attention_prefill` on the batch as it is (a prompt's prefill, a training forward);
* L == S, padding: the real tokens are packed into [T, H, D] rows, `attention_varlen`, scattered back
  (pad rows get zeros, which nothing downstream reads for a real token);
* L > S (a cache): `attention_decode`, one call per new token, against keys that start at the row's first
  real key (left-padded rows are gathered to start there), with lens = the real keys up to that token.

The kernels' contract makes all three give a token the same bits: varlen rows equal prefill rows of the
sequence alone, and decode equals the prefill row at lens - 1.
"""

from __future__ import annotations

import torch

from tik_kernels.hf.layout import TikBatch, TikUnsupported
from tik_kernels.ops.attention import attention_decode, attention_prefill, attention_varlen


def tik_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    tik_batch: TikBatch | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if tik_batch is None:
        raise TikUnsupported("tik attention runs only inside a model prepared by tik_kernels.hf.apply_tik")
    if dropout:
        raise TikUnsupported("apply_tik: attention dropout is not supported (config.attention_dropout = 0)")
    if sliding_window:
        raise TikUnsupported("apply_tik: sliding-window attention is not supported")
    B, hq, S, D = query.shape
    L = key.shape[2]
    if L == S and tik_batch.past == 0:
        if tik_batch.dense:
            return attention_prefill(query, key, value, scaling).transpose(1, 2), None
        idx = tik_batch.pack_idx
        q, k, v = (t.transpose(1, 2).reshape(B * S, t.shape[1], D)[idx] for t in (query, key, value))
        o = attention_varlen(q, k, v, tik_batch.cu_seqlens, scaling, tik_batch.max_len)
        out = torch.zeros((B * S, hq, D), dtype=o.dtype, device=o.device).index_copy(0, idx, o)
        return out.view(B, S, hq, D), None
    if L != tik_batch.past + S:
        raise TikUnsupported(f"apply_tik supports DynamicCache only: {L} keys for {tik_batch.past} + {S} tokens")
    if torch.is_grad_enabled() and query.requires_grad:
        raise TikUnsupported("apply_tik: no gradient through a KV cache (train with a forward over whole sequences)")
    if tik_batch.key_index is not None:
        g = tik_batch.key_index[:, None, :, None].expand(B, key.shape[1], L, D)
        key, value = key.gather(2, g), value.gather(2, g)
    outs = [
        attention_decode(query[:, :, i : i + 1], key, value, tik_batch.lens - (S - 1 - i), scaling)
        for i in range(S)
    ]
    return torch.cat(outs, dim=2).transpose(1, 2), None
