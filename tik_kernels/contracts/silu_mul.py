"""Contract of `silu_mul(x[T, 2F]) -> silu(x[:, :F]) * x[:, F:]` (the [gate | up] halves of a fused projection).

Frozen. Inputs are bf16: gate ~ 2·N(0, 1) (so both silu's linear and saturating regions are hit), up ~ N(0, 1).

Tolerances (against float64): the kernel computes in fp32 and rounds once to bf16 (unit roundoff 2^-8),
measured rel_rms 1.7–1.9e-3 in the interpreter (eager `F.silu(a) * b` rounds twice). 1e-2 leaves ~5×
margin and is far below swapping gate and up or a missing sigmoid. Gradients: elementwise, fp32, rounded
once: same bound.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
from tik_kernels.contracts._common import with_grad_rerun
from tik_kernels.models import DECODE_BATCHES, MODELS, TRAIN_TOKENS
from tik_kernels.reference.silu_mul import silu_mul as silu_mul_ref

TOL = Tolerance(rel_rms=1e-2)
GRAD_TOL = Tolerance(rel_rms=1e-2)

CPU_SIZES = (1, 2, 3, 7, 12)
#: the widest row is 2 × 14336: 1024 tokens keep a probe at 59 MB
GPU_SIZES = (1, 2, 3, 7, 64, 255, 1024)


def _inputs(Fdim: int, T: int, gen: torch.Generator, device: str = "cpu") -> tuple:
    gate = 2.0 * torch.randn((T, Fdim), generator=gen, device=device)
    up = torch.randn((T, Fdim), generator=gen, device=device)
    return (torch.cat([gate, up], dim=1).to(torch.bfloat16),)


def config(name: str, Fdim: int) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: _inputs(Fdim, T, gen),
        token_args=(0,),
        reference=silu_mul_ref,
        tolerance=TOL,
        grad_args=(0,),
        grad_tolerance=GRAD_TOL,
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    if profile == "cpu":
        # an odd width (a partial block at every row end) and a small power of two
        return [config("ffn[F=45]", 45), config("ffn[F=64]", 64)]
    if profile == "gpu":
        widths = sorted({m.intermediate for m in MODELS})
        return [config(f"ffn[F={f}]", f) for f in widths]
    raise ValueError(f"unknown profile {profile!r}")


def make_plan(cfgs: list[TokenwiseConfig], sizes: tuple[int, ...], seed: int) -> Plan:
    return with_grad_rerun(tokenwise_plan("silu_mul", cfgs, sizes, seed))


def build_plan(profile: str, seed: int) -> Plan:
    return make_plan(configs(profile), CPU_SIZES if profile == "cpu" else GPU_SIZES, seed)


def cells(profile: str) -> list[Cell]:
    """Decode batches and packed training micro-batches per model FFN width, coefficient 1.0 each (AReaL-TIK)."""
    if profile == "cpu":
        return [Cell(f"cpu/ffn[T={T},F=64]", {"T": T, "F": 64}) for T in (1, 16)]
    out = []
    for m in MODELS:
        if any(c.params["F"] == m.intermediate for c in out):
            continue
        for T in DECODE_BATCHES + TRAIN_TOKENS:
            regime = "decode" if T in DECODE_BATCHES else "train"
            out.append(Cell(f"{m.name}/{regime}[T={T},F={m.intermediate}]",
                            {"model": m.name, "T": T, "F": m.intermediate}))
    return out


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    T, Fdim = cell.params["T"], cell.params["F"]
    (x,) = _inputs(Fdim, T, torch.Generator(device).manual_seed(seed), device)

    def baseline():
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    return BenchCase(entry="silu_mul", args=(x,), baseline=baseline,
                     bytes_moved=3 * T * Fdim * x.element_size(), token_args=(0,))


CONTRACT = Contract(
    op="silu_mul",
    entries=("silu_mul",),
    impl="tik_kernels.ops.silu_mul",
    summary="SwiGLU activation silu(gate) * up on x[T, 2F] = [gate | up]; bf16 in/out, fp32 math",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
