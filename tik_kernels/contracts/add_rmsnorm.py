"""Contract of `add_rmsnorm(x, residual, w, eps) -> (rmsnorm(x + residual), x + residual)` over x[T, H].

Frozen. Inputs are bf16; each token gets its own scale 10^U(-3.5, 1) (shared by x and residual), so
some rows have mean s² below eps and a wrong eps moves their outputs far beyond the tolerance.

Tolerances (against float64, exact math): the outgoing residual is x + residual rounded once to bf16
(unit roundoff 2^-8; measured rel_rms ≈ 1.6e-3); the normalized output rounds the sum, x̂ and w·x̂
(Hugging Face cast order), measured ≈ 2.8e-3 in the interpreter. 1e-2 leaves 4× margin and stays 10×
below a wrong eps or a missing weight. Gradients: d(x) = d(residual) rounded once to bf16, dw accumulated
in fp32 then rounded: same bound.
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
from tik_kernels.contracts._common import with_grad_rerun, with_row_relative
from tik_kernels.models import DECODE_BATCHES, MODELS, TRAIN_TOKENS
from tik_kernels.reference.add_rmsnorm import add_rmsnorm as add_rmsnorm_ref

TOL = Tolerance(rel_rms=1e-2)
GRAD_TOL = Tolerance(rel_rms=1e-2)
#: worst per-token relative error (rows of tiny scale must be as accurate as the others)
ROW_TOL = 2e-2

CPU_SIZES = (1, 2, 3, 7, 12)
GPU_SIZES = (1, 2, 3, 7, 64, 255, 1024, 2048)


def _inputs(H: int, T: int, gen: torch.Generator, device: str = "cpu") -> tuple:
    """x[T, H], residual[T, H] bf16 with a per-token scale spanning 10^-3.5 … 10; w[H] bf16 around 1."""
    scale = torch.pow(10.0, torch.rand((T, 1), generator=gen, device=device) * 4.5 - 3.5)
    x = (torch.randn((T, H), generator=gen, device=device) * scale).to(torch.bfloat16)
    residual = (torch.randn((T, H), generator=gen, device=device) * scale).to(torch.bfloat16)
    w = (1.0 + 0.5 * torch.randn(H, generator=gen, device=device)).to(torch.bfloat16)
    return x, residual, w


def config(name: str, H: int, eps: float) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: _inputs(H, T, gen),
        token_args=(0, 1),
        reference=lambda x, r, w: add_rmsnorm_ref(x, r, w, eps),
        tolerance=TOL,
        grad_args=(0, 1, 2),
        grad_tolerance=GRAD_TOL,
        kwargs={"eps": eps},
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    if profile == "cpu":
        # an odd width (masked lanes) and a power-of-two width with a second eps
        return [config("hidden[H=100]", 100, 1e-6), config("hidden[H=64]", 64, 1e-5)]
    if profile == "gpu":
        out, seen = [], set()
        for m in MODELS:
            if (m.hidden, m.rms_eps) not in seen:
                seen.add((m.hidden, m.rms_eps))
                out.append(config(f"{m.name}/hidden[H={m.hidden}]", m.hidden, m.rms_eps))
        return out
    raise ValueError(f"unknown profile {profile!r}")


def make_plan(cfgs: list[TokenwiseConfig], sizes: tuple[int, ...], seed: int) -> Plan:
    """The token-wise plan plus backward reruns and per-token accuracy (tests use it on one config)."""
    plan = with_grad_rerun(tokenwise_plan("add_rmsnorm", cfgs, sizes, seed))
    return with_row_relative(plan, cfgs, ROW_TOL)


def build_plan(profile: str, seed: int) -> Plan:
    return make_plan(configs(profile), CPU_SIZES if profile == "cpu" else GPU_SIZES, seed)


def cells(profile: str) -> list[Cell]:
    """Decode batches and packed training micro-batches per model width, coefficient 1.0 each (AReaL-TIK's choice)."""
    if profile == "cpu":
        return [Cell(f"cpu/hidden[T={T},H=64]", {"T": T, "H": 64, "eps": 1e-6}) for T in (1, 16)]
    out, seen = [], set()
    for m in MODELS:
        for T in DECODE_BATCHES + TRAIN_TOKENS:
            if (m.hidden, T) in seen:
                continue
            seen.add((m.hidden, T))
            regime = "decode" if T in DECODE_BATCHES else "train"
            out.append(Cell(f"{m.name}/{regime}[T={T},H={m.hidden}]",
                            {"model": m.name, "T": T, "H": m.hidden, "eps": m.rms_eps}))
    return out


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    T, H, eps = cell.params["T"], cell.params["H"], cell.params["eps"]
    x, residual, w = _inputs(H, T, torch.Generator(device).manual_seed(seed), device)

    def baseline():
        s = x + residual
        return F.rms_norm(s, (H,), w, eps), s

    return BenchCase(
        entry="add_rmsnorm",
        args=(x, residual, w),
        kwargs={"eps": eps},
        baseline=baseline,
        bytes_moved=4 * x.numel() * x.element_size() + w.numel() * w.element_size(),
        token_args=(0, 1),
    )


CONTRACT = Contract(
    op="add_rmsnorm",
    entries=("add_rmsnorm",),
    impl="tik_kernels.ops.add_rmsnorm",
    summary="residual add + RMSNorm over x[T,H] -> (normed, new residual); bf16 in/out, fp32 math",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL, "per_token": Tolerance(rel_rms=ROW_TOL)},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
