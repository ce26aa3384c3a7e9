"""Float64 references of `logprob` and `entropy` (the lm_head + softmax family). Frozen.

Computed on the GPU when one is present (float64 there), only for speed at vocabulary sizes
like 151,936: the math is the same exact-as-float64 formula either way, and results come back
on the caller's device.
"""

from __future__ import annotations

import torch


def _work_device(x: torch.Tensor) -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else x.device


def logits(hidden: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
    """hidden[T, H] @ w[V, H].T / temperature in float64 (temperature 0 means no scaling: greedy)."""
    dev = _work_device(hidden)
    z = hidden.to(dev, torch.float64) @ w.to(dev, torch.float64).T
    return z / temperature if temperature else z


def logprob(hidden: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(hidden @ w.T / temperature)[t, targets[t]], float64[T]."""
    z = logits(hidden, w, temperature)
    out = z.log_softmax(-1).gather(-1, targets.to(z.device, torch.int64)[:, None])[:, 0]
    return out.to(hidden.device)


def entropy(hidden: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy −Σ p log p of softmax(hidden @ w.T / temperature), float64[T]."""
    logp = logits(hidden, w, temperature).log_softmax(-1)
    return (-(logp.exp() * logp).sum(-1)).to(hidden.device)
