"""Where each token of a Hugging Face [B, S] batch sits in its own sequence: `TikBatch`, computed once per forward.

HF batches are padded rectangles; TIK's kernels are token-major and their bits depend only on a token's own
sequence (its position and the keys before it, counted from the sequence's first real token). So every
forward first reads the 2-D attention mask: a token's position is the number of real tokens before it
(what `generate` puts in `position_ids`), and attention sees each sequence without its padding:

* no cache (a prompt's prefill, a training forward): real tokens must form one run per row (left and/or
  right padding); unpadded batches go to `attention_prefill` as they are, padded ones are packed to
  [T, ...] rows and go to `attention_varlen`;
* with a KV cache (decode, or a chunk on top of a cache): padding may only be on the left, and the new
  tokens must be real; each row's keys are gathered to start at its first real key, so the KV blocks line
  up with the training forward's.

Anything else is refused here with one line (`TikUnsupported`), before any kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class TikUnsupported(ValueError):
    """A model, config or input that `apply_tik` does not handle; the message says what is supported."""


@dataclass
class TikBatch:
    """The layout of one forward over `B` rows of `S` new tokens on top of `past` cached ones."""

    #: [B, S] int64 position of each new token in its own sequence (pads: 0)
    pos: torch.Tensor
    #: tokens already in the KV cache (the same for every row: HF caches are rectangles)
    past: int
    #: no cache, no padding: the dense prefill kernel takes the batch as it is
    dense: bool
    #: no cache, padding: flat indices of the real tokens in [B * S], cu_seqlens [B + 1] and the longest row
    pack_idx: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_len: int = 0
    #: with a cache: [B] int32 real keys per row after this forward, and for left-padded rows the index map
    #: [B, past + S] that moves each row's keys to start at 0 (None: no row is padded)
    lens: torch.Tensor | None = None
    key_index: torch.Tensor | None = None


def make_batch(
    batch: int,
    new: int,
    past: int,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    device: torch.device,
) -> TikBatch:
    """The TikBatch of a forward; one host sync (the padding checks), no kernels."""
    total = past + new
    if attention_mask is None:
        mask = torch.ones((batch, total), dtype=torch.bool, device=device)
    elif attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, total):
        raise TikUnsupported(
            f"apply_tik takes a 2-D 0/1 attention_mask of shape [batch, past + new] = [{batch}, {total}], "
            f"got {tuple(attention_mask.shape)}"
        )
    else:
        mask = attention_mask.to(device=device, dtype=torch.bool)
    # a row's real tokens start wherever the mask goes 0 -> 1 (or at column 0)
    starts = (mask[:, 1:] & ~mask[:, :-1]).sum(1) + mask[:, 0].long()
    ends_early = (mask[:, :-1] & ~mask[:, 1:]).any(1)
    pos = (mask.long().cumsum(1) - 1).clamp(min=0)[:, past:]
    counts = mask.sum(1)
    wrong_pos = torch.zeros((), dtype=torch.bool, device=device)
    if position_ids is not None:
        wrong_pos = ((position_ids.to(device).expand(batch, new) != pos) & mask[:, past:]).any()
    # every data-dependent decision in one host sync
    gap, early, new_pad, wrong, all_real, longest = torch.stack([t.long() for t in (
        (starts > 1).any(), ends_early.any(), ~mask[:, past:].all(), wrong_pos, mask.all(), counts.max(),
    )]).tolist()  # fmt: skip
    if past and (gap or early or new_pad):
        # with a cache the new tokens extend every row, so padding can only be on the left
        raise TikUnsupported(
            "apply_tik: with a KV cache, padding must be on the left and the new tokens real "
            "(tokenizer.padding_side = 'left' for generate)"
        )
    if gap:
        raise TikUnsupported("apply_tik: attention_mask has a gap inside a row (one run of real tokens per row)")
    if wrong:
        raise TikUnsupported(
            "apply_tik: position_ids must count each row's real tokens from 0 (packed sequences and "
            "custom positions are not supported); leave them out and TIK derives them from attention_mask"
        )
    if past:
        key_index = None
        if not all_real:
            pad = total - counts
            key_index = (pad[:, None] + torch.arange(total, device=device)[None, :]).clamp(max=total - 1)
        return TikBatch(pos=pos, past=past, dense=False, lens=counts.to(torch.int32), key_index=key_index)
    if all_real:
        return TikBatch(pos=pos, past=0, dense=True)
    cu = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    cu[1:] = counts.cumsum(0)
    return TikBatch(
        pos=pos, past=0, dense=False, pack_idx=mask.reshape(-1).nonzero().squeeze(1), cu_seqlens=cu,
        max_len=int(longest),
    )
