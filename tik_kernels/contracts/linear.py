"""Contract of `linear(x[T, K], w[N, K]) -> x @ w.T`: the projections of a transformer layer.

Frozen. A row of the output must have the same bits for any T (1 … 4096 on the GPU profile),
any order of the rows, repeated rows, packed or padded batches, because the rollout engine
(decode, T = batch size) and the trainer (packed micro-batches, T up to 16k) call the same
linear. BLOCK_K and KCHUNK are frozen tunables: they fix the reduction tree over K. The output
tile and how the K chunks are spread over programs (split or not) may follow T (CONFIG buckets),
and these checks are what proves they change no bits.

Inputs: x ~ N(0, 1) and w ~ N(0, 1/K), in bf16. The CPU profile adds a "cancel" configuration:
pairs of weight columns that cancel exactly (x[:, j] = x[:, i], w[:, j] = -w[:, i], scaled by
2^12), so the fp32 partial sums are ~2^24 while the result is O(1): any change in the
summation order (a T-dependent BLOCK_K, a split-K for large T) then moves the bf16 outputs,
which the invariance checks see even at K = 64 in the interpreter. A second CPU plan runs
them at N = 16, K = 2088: three K chunks of 1024 (the root's NARROW_KCHUNK, the chunk of an output of
at most NARROW_N = 2048 columns), the last one partial (three, so that a merge in another order moves
bits: fp32 addition of two is commutative), and T from 1 to 20 across two CONFIG buckets, so a chunk
size or a merge order that follows T moves bits there. (Until the narrow chunks were the root's, the
same three chunks were KCHUNK's 2048 at K = 4136; at that K the N = 16 output now has five chunks of
1024, which checks nothing more and costs the interpreter twice the time.)

Tolerances (against float64 on the same bf16 inputs): output rounded to bf16 once after fp32
accumulation: rel_rms 1.6e-3 on the GPU (round to nearest), 3.3e-3 in the interpreter (its cast
truncates). 6e-3 holds both with margin and fails a bf16-accumulated reduction at these K.
Gradients: dx and dw are the same kernel (fp32 accumulation, one bf16 rounding): same bound.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tik_kernels.contract import (
    GRADIENT_REQUIREMENT,
    TOKENWISE_REQUIREMENTS,
    BenchCase,
    Cell,
    Contract,
    Plan,
    Probe,
    Results,
    TokenwiseConfig,
    Tolerance,
    accurate,
    bitwise_equal,
    tokenwise_plan,
)
from tik_kernels.models import LLAMA3_8B, QWEN3_8B, TRAIN_TOKENS, ModelShape
from tik_kernels.reference.linear import linear as linear_ref
from tik_kernels.reference.linear import linear_grads

TOL = Tolerance(rel_rms=6e-3)
GRAD_TOL = Tolerance(rel_rms=6e-3)

CPU_SIZES = (1, 2, 3, 7, 8, 9, 16)
#: the CPU plan of a K cut into several chunks: T on both sides of the M16 / M64 bucket edge
CPU_CHUNK_SIZES = (1, 3, 16, 17, 20)
CPU_CHUNK_SHAPE = (16, 2 * 1024 + 40)
GPU_SIZES = (1, 7, 16, 17, 64, 256, 1024, 4096)
#: rows a rollout's linear sees (decode batches, the last prefill steps) beside the training token counts
ROLLOUT_ROWS = (1, 4, 16, 64, 256)
#: tokens in the accuracy / gradient probes (float64 references are computed on the CPU)
CPU_ACC_T, GPU_ACC_T = 13, 64

#: H200 figures measured here, for the cells' coefficients: copy bandwidth (bytes/µs), bf16 matmul (flop/µs)
_BYTES_PER_US = 4.23e6
_FLOP_PER_US = 7.0e8


@dataclass(frozen=True)
class Projection:
    """One weight shape w[N, K] of a transformer layer, and the models that have it."""

    name: str
    N: int
    K: int
    models: tuple[str, ...]


def projections(models: tuple[ModelShape, ...] = (QWEN3_8B, LLAMA3_8B)) -> list[Projection]:
    """qkv (fused), o, gate_up (fused), down of each model, one entry per distinct (N, K)."""
    found: dict[tuple[int, int], Projection] = {}
    for m in models:
        for name, N, K in (
            ("qkv", m.q_size + 2 * m.kv_size, m.hidden),
            ("o", m.hidden, m.q_size),
            ("gate_up", 2 * m.intermediate, m.hidden),
            ("down", m.hidden, m.intermediate),
        ):
            old = found.get((N, K))
            found[(N, K)] = Projection(name, N, K, (old.models if old else ()) + (m.name,))
    return list(found.values())


def _normal(N: int, K: int):
    def make(T: int, gen: torch.Generator) -> tuple:
        x = torch.randn(T, K, generator=gen).to(torch.bfloat16)
        w = (torch.randn(N, K, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
        return x, w

    return make


def _cancelling(N: int, K: int):
    """Column pairs (i, j) with x[:, j] = x[:, i] and w[:, j] = -w[:, i], both scaled by 2^12."""

    def make(T: int, gen: torch.Generator) -> tuple:
        x = torch.randn(T, K, generator=gen)
        w = torch.randn(N, K, generator=gen) / math.sqrt(K)
        perm = torch.randperm(K, generator=gen)
        n_pairs = K // 4
        i, j = perm[:n_pairs], perm[n_pairs : 2 * n_pairs]
        x[:, i] *= 4096.0
        w[:, i] *= 4096.0
        x[:, j] = x[:, i]
        w[:, j] = -w[:, i]
        return x.to(torch.bfloat16), w.to(torch.bfloat16)

    return make


@dataclass(frozen=True)
class _Shape:
    name: str
    N: int
    K: int
    cancel: bool = False


def _shapes(profile: str) -> list[_Shape]:
    if profile == "cpu":
        # a K that is no multiple of any BLOCK_K (masked tail), odd N (masked columns), and the cancelling inputs
        return [_Shape("w[N=48,K=64]", 48, 64), _Shape("w[N=40,K=40]", 40, 40),
                _Shape("cancel[N=64,K=64]", 64, 64, cancel=True)]
    if profile == "gpu":
        # qkv and o are shared by Qwen3-8B and Llama-3-8B; Llama's gate_up / down are the widest
        keep = {"qkv", "o"}
        out = []
        for p in projections():
            if p.name in keep or "llama3-8b" in p.models and p.name in ("gate_up", "down"):
                out.append(_Shape(f"{p.name}[N={p.N},K={p.K}]", p.N, p.K))
        return out
    raise ValueError(f"unknown profile {profile!r}")


def _accuracy_and_gradients(plan: Plan, s: _Shape, T: int, gen: torch.Generator) -> None:
    """Forward and both gradients against float64 at T rows; backward determinism; dx rows invariant."""
    x, w = _normal(s.N, s.K)(2 * T, gen)
    x, extra = x[:T].clone(), x[T:]
    dy = torch.randn(T, s.N, generator=gen).to(torch.bfloat16)
    p = f"{s.name}/"
    fid = plan.add(Probe(p + f"accuracy[T={T}]", "linear", (x, w)))
    ref = linear_ref(x.double(), w.double())

    def accuracy(res: Results, fid=fid, ref=ref):
        return accurate(res[fid][0], ref, TOL, "output")

    plan.check(p + "accuracy", "accuracy", accuracy)

    bid = plan.add(Probe(p + f"backward[T={T}]", "linear", (x, w), grad_args=(0, 1), grad_outputs=(dy,)))
    rid = plan.add(Probe(p + "backward/rerun", "linear", (x, w), grad_args=(0, 1), grad_outputs=(dy,)))
    dx_ref, dw_ref = linear_grads(x.double(), w.double(), dy)

    def gradient(res: Results, bid=bid, dx_ref=dx_ref, dw_ref=dw_ref):
        got = res[bid]
        if len(got) != 3:
            return False, f"{len(got)} outputs + gradients, expected 3"
        details, worst = [], 0.0
        for label, g, r in (("dx", got[1], dx_ref), ("dw", got[2], dw_ref)):
            ok, detail, d = accurate(g, r, GRAD_TOL, label)
            if not ok:
                return False, detail, d
            details.append(detail)
            worst = max(worst, d)
        return True, "; ".join(details), worst

    plan.check(p + "gradient", "gradient", gradient)

    def backward_determinism(res: Results, bid=bid, rid=rid):
        for k, (a, b) in enumerate(zip(res[bid], res[rid], strict=True)):
            ok, detail, d = bitwise_equal(a, b, ("y", "dx", "dw")[k] if k < 3 else f"output {k}")
            if not ok:
                return False, "backward rerun differs: " + detail, d
        return True, "output, dx and dw bitwise identical on rerun", 0.0

    plan.check(p + "backward_determinism", "determinism", backward_determinism)

    # the same rows, permuted, among unrelated rows: dx of each row depends on that row's dy only
    n_extra = max(1, T // 2)
    perm = torch.randperm(T, generator=gen)
    xs = torch.cat([x[perm], extra[:n_extra]])
    dys = torch.cat([dy[perm], torch.randn(n_extra, s.N, generator=gen).to(torch.bfloat16)])
    sid = plan.add(Probe(p + "backward/mixed", "linear", (xs, w), grad_args=(0,), grad_outputs=(dys,)))

    def dx_rows(res: Results, bid=bid, sid=sid, perm=perm):
        full, sub = res[bid], res[sid]
        if len(full) < 2 or len(sub) < 2:
            return False, "missing dx"
        ok, detail, d = bitwise_equal(sub[1][: len(perm)], full[1][perm], "dx rows")
        if not ok:
            return False, detail, d
        return True, f"dx of {len(perm)} rows bitwise equal when permuted among {n_extra} other rows", 0.0

    plan.check(p + "batch_invariance[dx rows]", "batch_invariance", dx_rows)


def build_plan(profile: str, seed: int) -> Plan:
    sizes = CPU_SIZES if profile == "cpu" else GPU_SIZES
    acc_t = CPU_ACC_T if profile == "cpu" else GPU_ACC_T
    shapes = _shapes(profile)
    # invariance at every size; accuracy and gradients at a small T below (float64 on the CPU)
    configs = [
        TokenwiseConfig(s.name, (_cancelling if s.cancel else _normal)(s.N, s.K), token_args=(0,)) for s in shapes
    ]
    plan = tokenwise_plan("linear", configs, sizes, seed)
    if profile == "cpu":
        N, K = CPU_CHUNK_SHAPE
        chunked = TokenwiseConfig(f"chunks[N={N},K={K}]", _cancelling(N, K), token_args=(0,))
        plan.extend(tokenwise_plan("linear", [chunked], CPU_CHUNK_SIZES, seed + 2))
    rng = random.Random(seed + 1)
    for s in shapes:
        if not s.cancel:
            _accuracy_and_gradients(plan, s, acc_t, torch.Generator().manual_seed(rng.randrange(2**31)))
    return plan


def _roofline_us(M: int, N: int, K: int) -> float:
    """The H200's floor for one call: each operand moved once at copy bandwidth, or the flops at peak."""
    return max(2 * (M * K + N * K + M * N) / _BYTES_PER_US, 2 * M * N * K / _FLOP_PER_US)


def cells(profile: str) -> list[Cell]:
    """Each projection × M in the rollout row counts (decode batches) and training token counts.

    coeff = 1 / roofline time in µs, so every cell weighs about the same in Σ coeff · median
    (the objective is then a sum of "multiples of the floor"); without it the 16k-token cells
    would decide everything and decode none. Decode cells (≤ 64 rows, 5–25 µs) get a 10% limit:
    their medians move by a few % run to run.
    """
    if profile == "cpu":
        return [Cell(f"cpu/w[N=48,K=64]/M={M}", {"M": M, "N": 48, "K": 64, "proj": "cpu", "models": []}, 1.0)
                for M in (1, 16)]
    out = []
    for p in projections():
        for M in ROLLOUT_ROWS + TRAIN_TOKENS:
            out.append(Cell(
                f"{p.name}[N={p.N},K={p.K}]/M={M}",
                {"M": M, "N": p.N, "K": p.K, "proj": p.name, "models": list(p.models)},
                coeff=round(1.0 / _roofline_us(M, p.N, p.K), 8),
                limit=0.10 if M <= 64 else 0.05,
            ))
    return out


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    M, N, K = cell.params["M"], cell.params["N"], cell.params["K"]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=device).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device=device) / math.sqrt(K)).to(torch.bfloat16)
    return BenchCase(
        entry="linear",
        args=(x, w),
        baseline=lambda: F.linear(x, w),
        bytes_moved=2 * (M * K + N * K + M * N),
        flops=2 * M * N * K,
        token_args=(0,),
    )


CONTRACT = Contract(
    op="linear",
    entries=("linear",),
    impl="tik_kernels.ops.linear",
    summary="y = x @ w.T for x[T,K], w[N,K]; bf16 in/out, fp32 accumulation, same bits per row for any T",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
    frozen_tunables=frozenset({"BLOCK_K", "KCHUNK", "NARROW_N", "NARROW_KCHUNK"}),
)
