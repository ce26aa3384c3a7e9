"""Contract of `logprob(hidden[T, H], w[V, H], targets[T], temperature) -> fp32[T]`. Frozen.

The token-wise plan (hidden and targets are token arguments): any T, order, repetition and packing
give the same bits per token; deterministic; inputs unchanged; accurate; gradients of hidden and w.

Tolerances (against float64 on the same bf16 inputs): the kernel's logits are fp32 sums of exact
bf16 products, so logprobs are off by ~1e-6 relative (measured in the interpreter: max |Δ| 1.2e-6 at
|logprob| ~ 10). rel_rms 1e-4 / max_abs 1e-3 leave ~100× margin and still fail an implementation that
rounds the logits to bf16 (as the stock `(hidden @ w.T).float()` does: ~1e-2 absolute) or gets the
temperature wrong. Gradients are rounded to bf16 once (dz is rounded to bf16 for the tensor-core
matmuls on the GPU): measured rel_rms 1.7e-3; bound 1e-2.
"""

from __future__ import annotations

import torch

from tik_kernels.contract import (
    GRADIENT_REQUIREMENT,
    TOKENWISE_REQUIREMENTS,
    BenchCase,
    Cell,
    Contract,
    Plan,
    TokenwiseConfig,
    Tolerance,
    tokenwise_plan,
)
from tik_kernels.contracts._lmhead import bench_inputs, hidden_and_weight, lmhead_bytes, lmhead_cells, shapes, sizes
from tik_kernels.models import DECODE_BATCHES
from tik_kernels.reference.logprob import logprob as logprob_ref

TOL = Tolerance(rel_rms=1e-4, max_abs=1e-3)
GRAD_TOL = Tolerance(rel_rms=1e-2)


def _inputs(T: int, H: int, V: int, temperature: float, gen: torch.Generator) -> tuple:
    hidden, w = hidden_and_weight(T, H, V, gen)
    targets = torch.randint(0, V, (T,), generator=gen)
    return hidden, w, targets, temperature


def config(name: str, H: int, V: int, temperature: float) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: _inputs(T, H, V, temperature, gen),
        token_args=(0, 2),
        reference=logprob_ref,
        tolerance=TOL,
        grad_args=(0, 1),
        grad_tolerance=GRAD_TOL,
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    return [config(name, H, V, tau) for name, H, V, tau in shapes(profile)]


def build_plan(profile: str, seed: int) -> Plan:
    return tokenwise_plan("logprob", configs(profile), sizes(profile), seed)


def cells(profile: str) -> list[Cell]:
    """Rollout decode batches (the rollout scores each sampled token) and training micro-batches."""
    return lmhead_cells(profile, DECODE_BATCHES + (1024, 4096))


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    hidden, w, tau = bench_inputs(cell, seed, device)
    gen = torch.Generator().manual_seed(seed + 1)
    targets = torch.randint(0, w.shape[0], (hidden.shape[0],), generator=gen).to(device)

    def baseline():
        return torch.log_softmax((hidden @ w.T).float() / tau, -1).gather(-1, targets[:, None])[:, 0]

    return BenchCase(
        entry="logprob",
        args=(hidden, w, targets, tau),
        baseline=baseline,
        bytes_moved=lmhead_bytes(hidden, w, 8 + 4),
        flops=2 * hidden.shape[0] * w.shape[0] * w.shape[1],
        token_args=(0, 2),
    )


CONTRACT = Contract(
    op="logprob",
    entries=("logprob",),
    impl="tik_kernels.ops.logprob",
    summary="fused lm_head + temperature + log-softmax + gather: log p(target) per token, fp32, no [T,V] logits",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
