"""Float64 reference of RMSNorm over the last dim (hidden norm and per-head q/k norm). Frozen."""

from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x², -1) + eps) · w, computed in float64 (exact math, no intermediate rounding)."""
    x, w = x.double(), w.double()
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w
