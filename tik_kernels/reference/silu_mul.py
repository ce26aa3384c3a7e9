"""Float64 reference of the SwiGLU activation on x[..., 2F] = [gate | up]. Frozen."""

from __future__ import annotations

import torch


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up = gate · sigmoid(gate) · up, in float64."""
    x = x.double()
    gate, up = x.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up
