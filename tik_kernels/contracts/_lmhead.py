"""Shared pieces of the lm_head-family contracts (logprob, entropy, sample): inputs, shapes, cells. Frozen.

Inputs: hidden[T, H] ~ N(0, 1) and w[V, H] ~ N(0, (LOGIT_STD² / H)), both bf16, so logits have a
standard deviation of about LOGIT_STD (3): distributions as peaked as a trained model's (the top token
takes a few percent of the mass at V = 151,936, most of it at V = 256). Temperatures differ from 1 so
that a kernel that drops, inverts or misplaces the temperature is off by far more than the tolerance.
"""

from __future__ import annotations

import torch

from tik_kernels.contract import Cell
from tik_kernels.models import DECODE_BATCHES, MODELS, ModelShape

LOGIT_STD = 3.0

CPU_SIZES = (1, 2, 3, 7, 12)
GPU_SIZES = (1, 8, 64, 256, 1024)

#: (name, H, V, temperature) of the CPU profile: a power-of-two shape and an odd one (masked lanes and tiles)
CPU_SHAPES = (("H=64,V=256", 64, 256, 0.7), ("H=40,V=200", 40, 200, 1.3))
#: the GPU profile: Qwen3-0.6B and Qwen3-8B lm_head (V = 151,936)
GPU_MODELS = tuple(m for m in MODELS if m.name in ("qwen3-0.6b", "qwen3-8b"))
GPU_TEMPERATURE = 0.8


def hidden_and_weight(T: int, H: int, V: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.randn((T, H), generator=gen).to(torch.bfloat16)
    w = (torch.randn((V, H), generator=gen) * (LOGIT_STD / H**0.5)).to(torch.bfloat16)
    return hidden, w


def shapes(profile: str) -> list[tuple[str, int, int, float]]:
    if profile == "cpu":
        return list(CPU_SHAPES)
    if profile == "gpu":
        return [(f"{m.name}[H={m.hidden},V={m.vocab}]", m.hidden, m.vocab, GPU_TEMPERATURE) for m in GPU_MODELS]
    raise ValueError(f"unknown profile {profile!r}")


def sizes(profile: str) -> tuple[int, ...]:
    return CPU_SIZES if profile == "cpu" else GPU_SIZES


def lmhead_cells(profile: str, token_counts: tuple[int, ...]) -> list[Cell]:
    """One cell per (model lm_head, T); coefficient 1.0 each. CPU: two tiny cells."""
    if profile == "cpu":
        return [Cell(f"cpu[T={T},H=64,V=256]", {"T": T, "H": 64, "V": 256, "temperature": 0.7}) for T in (1, 12)]
    out = []
    models: tuple[ModelShape, ...] = MODELS
    for m in models:
        for T in token_counts:
            regime = "decode" if T in DECODE_BATCHES else "train"
            out.append(Cell(f"{m.name}/{regime}[T={T},H={m.hidden},V={m.vocab}]",
                            {"model": m.name, "T": T, "H": m.hidden, "V": m.vocab, "temperature": GPU_TEMPERATURE}))
    return out


def bench_inputs(cell: Cell, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    p = cell.params
    gen = torch.Generator().manual_seed(seed)
    hidden, w = hidden_and_weight(p["T"], p["H"], p["V"], gen)
    return hidden.to(device), w.to(device), float(p["temperature"])


def lmhead_bytes(hidden: torch.Tensor, w: torch.Tensor, per_token_bytes: int) -> int:
    """Fewest bytes moved: the weight and the hidden states read once, per-token inputs/outputs."""
    return w.numel() * w.element_size() + hidden.numel() * hidden.element_size() + hidden.shape[0] * per_token_bytes
