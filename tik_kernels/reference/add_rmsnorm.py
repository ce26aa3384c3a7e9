"""Float64 reference of the fused residual add + RMSNorm. Frozen."""

from __future__ import annotations

import torch


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s / sqrt(mean(s², -1) + eps) · w, s) with s = x + residual, all in float64."""
    s = x.double() + residual.double()
    return s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * w.double(), s
