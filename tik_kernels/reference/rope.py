"""Float64 reference of rotary position embedding (neox half rotation, as in Llama / Qwen3). Frozen."""

from __future__ import annotations

import torch


def rope(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, theta: float = 1e6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each pair (x[i], x[i + D/2]) of q[T, Hq, D], k[T, Hk, D] by pos · theta^(-2i/D), in float64."""
    D = q.shape[-1]
    inv = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[:, None, None] * inv  # [T, 1, D/2]
    cos, sin = ang.cos(), ang.sin()

    def rot(x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return rot(q), rot(k)
