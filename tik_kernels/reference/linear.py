"""Float64 reference of `linear`: y = x @ w.T, with its gradients by autograd. Frozen; no Triton."""

from __future__ import annotations

import torch


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x[T, K] @ w[N, K].T in float64 (inputs upcast by the caller)."""
    return x.double() @ w.double().t()


def linear_grads(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of sum(linear(x, w) * dy) in float64: dx = dy @ w, dw = dy.T @ x."""
    dy = dy.double()
    return dy @ w.double(), dy.t() @ x.double()
