"""Contract of `rmsnorm(x[..., H], w[H], eps)`: hidden-state norm x[T, H] and Qwen3's per-head q/k norm x[T, Hh, D].

Frozen. Inputs are bf16; each row gets its own scale 10^U(-3.5, 1), so some rows have mean x² below eps
and a wrong eps (or a missing one) moves their outputs by far more than the tolerance.

Tolerances (against float64, exact math): the bf16 kernel rounds twice (x̂ to bf16, then w·x̂ to bf16,
the Hugging Face cast order), measured rel_rms 2.3e-3 in the interpreter (F.rms_norm, rounding once: 1.6e-3).
1e-2 leaves 4× margin and is still 10× below the error of a wrong eps, a missing weight or a bf16-only
reduction on these inputs. Gradients: dx rounded to bf16 once, dw accumulated in fp32 then rounded: same bound.
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
from tik_kernels.reference.rmsnorm import rmsnorm as rmsnorm_ref

TOL = Tolerance(rel_rms=1e-2)
GRAD_TOL = Tolerance(rel_rms=1e-2)
#: worst per-token relative error (rows of tiny scale must be as accurate as the others)
ROW_TOL = 2e-2

CPU_SIZES = (1, 2, 3, 7, 12)
GPU_SIZES = (1, 2, 3, 7, 64, 255, 1024, 2048)


def _inputs(row_shape: tuple[int, ...], T: int, gen: torch.Generator, device: str = "cpu") -> tuple:
    """x[T, *row_shape] bf16 with a per-token scale spanning 10^-3.5 … 10; w[last] bf16 around 1."""
    scale = torch.pow(10.0, torch.rand((T,) + (1,) * len(row_shape), generator=gen, device=device) * 4.5 - 3.5)
    x = (torch.randn((T, *row_shape), generator=gen, device=device) * scale).to(torch.bfloat16)
    w = (1.0 + 0.5 * torch.randn(row_shape[-1], generator=gen, device=device)).to(torch.bfloat16)
    return x, w


def config(name: str, row_shape: tuple[int, ...], eps: float) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: _inputs(row_shape, T, gen),
        token_args=(0,),
        reference=lambda x, w: rmsnorm_ref(x, w, eps),
        tolerance=TOL,
        grad_args=(0, 1),
        grad_tolerance=GRAD_TOL,
        kwargs={"eps": eps},
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    if profile == "cpu":
        # an odd width (masked lanes), a power-of-two width, and a 3-D q/k norm with a second eps
        return [
            config("hidden[H=100]", (100,), 1e-6),
            config("hidden[H=64]", (64,), 1e-6),
            config("qk_norm[Hh=3,D=16]", (3, 16), 1e-5),
        ]
    if profile == "gpu":
        out, seen = [], set()
        for m in MODELS:
            shapes = [("hidden", (m.hidden,))]
            if m.qk_norm:
                shapes += [("q_norm", (m.n_heads, m.head_dim)), ("k_norm", (m.n_kv_heads, m.head_dim))]
            for kind, shape in shapes:
                if (shape, m.rms_eps) in seen:
                    continue
                seen.add((shape, m.rms_eps))
                dims = ",".join(str(d) for d in shape)
                out.append(config(f"{m.name}/{kind}[{dims}]", shape, m.rms_eps))
        return out
    raise ValueError(f"unknown profile {profile!r}")


def make_plan(cfgs: list[TokenwiseConfig], sizes: tuple[int, ...], seed: int) -> Plan:
    """The token-wise plan plus backward reruns and per-token accuracy (tests use it on one config)."""
    plan = with_grad_rerun(tokenwise_plan("rmsnorm", cfgs, sizes, seed))
    return with_row_relative(plan, cfgs, ROW_TOL)


def build_plan(profile: str, seed: int) -> Plan:
    return make_plan(configs(profile), CPU_SIZES if profile == "cpu" else GPU_SIZES, seed)


def cells(profile: str) -> list[Cell]:
    """Decode batches and packed training micro-batches per model shape, coefficient 1.0 each (AReaL-TIK's choice)."""
    if profile == "cpu":
        return [Cell(f"cpu/hidden[T={T},H=64]", {"T": T, "row_shape": [64], "eps": 1e-6}) for T in (1, 16)]
    out, seen = [], set()
    for m in MODELS:
        shapes = [("hidden", [m.hidden])]
        if m.qk_norm:
            shapes += [("q_norm", [m.n_heads, m.head_dim]), ("k_norm", [m.n_kv_heads, m.head_dim])]
        for kind, shape in shapes:
            for T in DECODE_BATCHES + TRAIN_TOKENS:
                key = (tuple(shape), T)
                if key in seen:
                    continue
                seen.add(key)
                regime = "decode" if T in DECODE_BATCHES else "train"
                dims = ",".join(str(d) for d in shape)
                out.append(Cell(f"{m.name}/{kind}/{regime}[T={T},{dims}]",
                                {"model": m.name, "T": T, "row_shape": shape, "eps": m.rms_eps}))
    return out


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    T, shape, eps = cell.params["T"], tuple(cell.params["row_shape"]), cell.params["eps"]
    x, w = _inputs(shape, T, torch.Generator(device).manual_seed(seed), device)
    H = shape[-1]
    return BenchCase(
        entry="rmsnorm",
        args=(x, w),
        kwargs={"eps": eps},
        baseline=lambda: F.rms_norm(x, (H,), w, eps),
        bytes_moved=2 * x.numel() * x.element_size() + w.numel() * w.element_size(),
        token_args=(0,),
    )


CONTRACT = Contract(
    op="rmsnorm",
    entries=("rmsnorm",),
    impl="tik_kernels.ops.rmsnorm",
    summary="RMSNorm over the last dim (hidden norm x[T,H], per-head q/k norm x[T,Hh,D]); bf16 in/out, fp32 math",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL, "per_token": Tolerance(rel_rms=ROW_TOL)},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
