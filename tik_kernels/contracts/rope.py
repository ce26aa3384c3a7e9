"""Contract of `rope(q[T, Hq, D], k[T, Hk, D], pos[T], theta) -> (q, k)`: neox half rotation, depends on pos only.

Frozen. q, k are bf16 N(0, 1); positions are drawn uniformly from [0, 32768) with some repeats of 0 —
sequences packed back to back restart at 0, so a token's position is never its row index. The
batch-invariance relations (subsets, permutations, repeats, packing) therefore also check that the result
follows pos and not the row a token sits in.

Tolerances (against float64, exact math with float64 angles): the kernel rounds once to bf16 (measured
rel_rms 1.6e-3); its fp32 angle pos·inv_freq is off by up to ~pos·2^-23 rad ≈ 4e-3 rad at pos 32k on the
highest frequencies (the same error Hugging Face's fp32 cos/sin have), which moves rel_rms by well under
1e-3. 1e-2 leaves room for that and catches a wrong theta, the interleaved (GPT-J) convention, a sign
error or a position taken from the row index. Gradients are the inverse rotation: same bound.
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
from tik_kernels.contracts._common import with_grad_rerun
from tik_kernels.models import DECODE_BATCHES, MODELS, TRAIN_TOKENS
from tik_kernels.reference.rope import rope as rope_ref

TOL = Tolerance(rel_rms=1e-2)
GRAD_TOL = Tolerance(rel_rms=1e-2)
MAX_POS = 32768

CPU_SIZES = (1, 2, 3, 7, 12)
GPU_SIZES = (1, 2, 3, 7, 64, 255, 1024, 2048)


def _inputs(hq: int, hk: int, d: int, T: int, gen: torch.Generator, device: str = "cpu") -> tuple:
    q = torch.randn((T, hq, d), generator=gen, device=device).to(torch.bfloat16)
    k = torch.randn((T, hk, d), generator=gen, device=device).to(torch.bfloat16)
    pos = torch.randint(0, MAX_POS, (T,), generator=gen, device=device)
    pos[torch.rand(T, generator=gen, device=device) < 0.1] = 0
    return q, k, pos


def config(name: str, hq: int, hk: int, d: int, theta: float) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: _inputs(hq, hk, d, T, gen),
        token_args=(0, 1, 2),
        reference=lambda q, k, pos: rope_ref(q, k, pos, theta),
        tolerance=TOL,
        grad_args=(0, 1),
        grad_tolerance=GRAD_TOL,
        kwargs={"theta": theta},
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    if profile == "cpu":
        # GQA heads with a power-of-two half, and a non-power-of-two half (D = 24) with odd head counts
        return [config("gqa[Hq=4,Hk=2,D=16]", 4, 2, 16, 1e6), config("odd[Hq=3,Hk=1,D=24]", 3, 1, 24, 1e4)]
    if profile == "gpu":
        out, seen = [], set()
        for m in MODELS:
            key = (m.n_heads, m.n_kv_heads, m.head_dim, m.rope_theta)
            if key not in seen:
                seen.add(key)
                name = f"{m.name}[Hq={m.n_heads},Hk={m.n_kv_heads},D={m.head_dim}]"
                out.append(config(name, *key))
        return out
    raise ValueError(f"unknown profile {profile!r}")


def make_plan(cfgs: list[TokenwiseConfig], sizes: tuple[int, ...], seed: int) -> Plan:
    return with_grad_rerun(tokenwise_plan("rope", cfgs, sizes, seed))


def build_plan(profile: str, seed: int) -> Plan:
    return make_plan(configs(profile), CPU_SIZES if profile == "cpu" else GPU_SIZES, seed)


def cells(profile: str) -> list[Cell]:
    """Decode batches and packed training micro-batches per attention shape, coefficient 1.0 each (AReaL-TIK)."""
    if profile == "cpu":
        return [Cell(f"cpu/rope[T={T},Hq=4,Hk=2,D=16]", {"T": T, "hq": 4, "hk": 2, "d": 16, "theta": 1e6})
                for T in (1, 16)]
    out, seen = [], set()
    for m in MODELS:
        key = (m.n_heads, m.n_kv_heads, m.head_dim)
        if key in seen:
            continue
        seen.add(key)
        for T in DECODE_BATCHES + TRAIN_TOKENS:
            regime = "decode" if T in DECODE_BATCHES else "train"
            out.append(Cell(f"{m.name}/{regime}[T={T},Hq={m.n_heads},Hk={m.n_kv_heads},D={m.head_dim}]",
                            {"model": m.name, "T": T, "hq": m.n_heads, "hk": m.n_kv_heads, "d": m.head_dim,
                             "theta": m.rope_theta}))
    return out


def torch_rope(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, theta: float):
    """The stock eager PyTorch rope of Hugging Face's Llama/Qwen3 (fp32 cos/sin cast to bf16, rotate_half)."""
    d = q.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=q.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(q.dtype)[:, None, :], emb.sin().to(q.dtype)[:, None, :]

    def rotate_half(x):
        return torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    p = cell.params
    q, k, pos = _inputs(p["hq"], p["hk"], p["d"], p["T"], torch.Generator(device).manual_seed(seed), device)
    return BenchCase(
        entry="rope",
        args=(q, k, pos),
        kwargs={"theta": p["theta"]},
        baseline=lambda: torch_rope(q, k, pos, p["theta"]),
        bytes_moved=2 * (q.numel() + k.numel()) * q.element_size() + pos.numel() * pos.element_size(),
        token_args=(0, 1, 2),
    )


CONTRACT = Contract(
    op="rope",
    entries=("rope",),
    impl="tik_kernels.ops.rope",
    summary="rotary embedding of q[T,Hq,D], k[T,Hk,D] at pos[T] (neox half rotation); cos/sin from pos and theta",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
