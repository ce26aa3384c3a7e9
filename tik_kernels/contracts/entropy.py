"""Contract of `entropy(hidden[T, H], w[V, H], temperature) -> fp32[T]`. Frozen.

The token-wise plan (hidden is the token argument): any T, order, repetition and packing give the
same bits per token; deterministic; inputs unchanged; accurate; gradients of hidden and w.

Tolerances (against float64 on the same bf16 inputs): fp32 logits of exact bf16 products and an
fp32 online (max, Σe, Σe·z) give entropies within ~1e-6 relative (measured in the interpreter: max
|Δ| 6e-7 at H ~ 2.5). rel_rms 1e-4 / max_abs 1e-3 leave ~100× margin and fail bf16-rounded logits or
a wrong temperature. Gradients: rounded to bf16 once, measured rel_rms 1.7e-3; bound 1e-2.
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
from tik_kernels.reference.logprob import entropy as entropy_ref

TOL = Tolerance(rel_rms=1e-4, max_abs=1e-3)
GRAD_TOL = Tolerance(rel_rms=1e-2)


def config(name: str, H: int, V: int, temperature: float) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: (*hidden_and_weight(T, H, V, gen), temperature),
        token_args=(0,),
        reference=entropy_ref,
        tolerance=TOL,
        grad_args=(0, 1),
        grad_tolerance=GRAD_TOL,
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    return [config(name, H, V, tau) for name, H, V, tau in shapes(profile)]


def build_plan(profile: str, seed: int) -> Plan:
    return tokenwise_plan("entropy", configs(profile), sizes(profile), seed)


def cells(profile: str) -> list[Cell]:
    """Entropy is a training-side quantity (bonus / monitoring): a large decode batch and micro-batches."""
    return lmhead_cells(profile, (256, 1024, 4096))


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    hidden, w, tau = bench_inputs(cell, seed, device)

    def baseline():
        logp = torch.log_softmax((hidden @ w.T).float() / tau, -1)
        return -(logp.exp() * logp).sum(-1)

    return BenchCase(
        entry="entropy",
        args=(hidden, w, tau),
        baseline=baseline,
        bytes_moved=lmhead_bytes(hidden, w, 4),
        flops=2 * hidden.shape[0] * w.shape[0] * w.shape[1],
        token_args=(0,),
    )


CONTRACT = Contract(
    op="entropy",
    entries=("entropy",),
    impl="tik_kernels.ops.entropy",
    summary="fused lm_head + temperature + softmax entropy per token, fp32, no [T,V] logits",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
