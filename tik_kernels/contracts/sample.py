"""Contract of `sample(hidden[T, H], w[V, H], temperature, seeds[T]) -> int64 ids[T]`. Frozen.

Seeded Gumbel-max with the noise function specified in `tik_kernels/reference/sample.py`.

- batch_invariance, determinism, inputs_unchanged: the token-wise plan with hidden and seeds as the
  token arguments (a token and its seed travel together), at a temperature and greedy (temperature 0).
- accuracy: every sampled id is the float64 Gumbel-max of the same noise. Exact up to near-ties: the
  kernel's scores (fp32 logits of exact bf16 products, fp32 Gumbel transform) are within ~1e-5 of the
  float64 scores, so the id must lie in {v : score64[v] ≥ max score64 − δ} with δ = 1e-3 + 1e-5·|max|;
  a wrong temperature or other noise picks ids outside that set, and bf16-rounded logits (~1e-2 off) do so
  on every row whose top two scores lie within that rounding error.
- distribution: an independent statistical check that the draws follow softmax(logits/temperature):
  N draws (distinct seeds) for each of a few rows, a χ² test against the float64 probabilities over
  every id with an expected count ≥ 5 (the rest pooled), failing above the χ² quantile at p = 1e-6
  (Wilson–Hilferty). The seeds are fixed by the plan, so the check is deterministic.
"""

from __future__ import annotations

import math
import random

import torch

from tik_kernels.contract import (
    TOKENWISE_REQUIREMENTS,
    BenchCase,
    Cell,
    Contract,
    Plan,
    Probe,
    Requirement,
    Results,
    TokenwiseConfig,
    tokenwise_plan,
)
from tik_kernels.contracts._lmhead import bench_inputs, hidden_and_weight, lmhead_bytes, lmhead_cells, shapes
from tik_kernels.models import DECODE_BATCHES
from tik_kernels.reference.logprob import logits as logits_ref
from tik_kernels.reference.sample import scores as scores_ref

TIE_ABS, TIE_REL = 1e-3, 1e-5
CHI2_Z = 4.75  # one-sided normal quantile of p = 1e-6

CPU_SIZES = (1, 2, 3, 7, 12)
GPU_SIZES = (1, 8, 64, 256)
#: (rows, draws per row) of the distribution probe
CPU_DRAWS = (2, 1000)
GPU_DRAWS = (4, 4096)

REQUIREMENTS = (
    TOKENWISE_REQUIREMENTS[0],
    TOKENWISE_REQUIREMENTS[1],
    TOKENWISE_REQUIREMENTS[2],
    Requirement("accuracy", "accuracy",
                "each id is the float64 Gumbel-max of the specified noise (any near-tied id within 1e-3 allowed)"),
    Requirement("distribution", "custom",
                "draws over many seeds follow softmax(logits / temperature): χ² test at p = 1e-6"),
)


def _seeds(T: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**62), 2**62, (T,), generator=gen, dtype=torch.int64)


def config(name: str, H: int, V: int, temperature: float, w: torch.Tensor | None = None) -> TokenwiseConfig:
    """Fresh hidden states and seeds for T tokens; a fresh weight too unless `w` is given (it is shared,
    at the GPU profile's 151,936 × 4,096, to keep building the plan fast)."""

    def make_inputs(T: int, gen: torch.Generator) -> tuple:
        hidden, w_new = hidden_and_weight(T, H, V if w is None else 1, gen)
        return hidden, (w_new if w is None else w), temperature, _seeds(T, gen)

    return TokenwiseConfig(name=name, make_inputs=make_inputs, token_args=(0, 3))


def _allowed(scores: torch.Tensor) -> torch.Tensor:
    """[T, V] bool: ids whose float64 score is within the near-tie margin of the row's maximum."""
    best = scores.max(-1, keepdim=True).values
    return scores >= best - (TIE_ABS + TIE_REL * best.abs())


def _accuracy_check(plan: Plan, name: str, args: tuple) -> None:
    pid = plan.add(Probe(f"{name}/exact_noise", "sample", args))
    allowed = _allowed(scores_ref(args[0].double(), args[1].double(), args[2], args[3]))

    def fn(res: Results, pid=pid, allowed=allowed):
        ids = res[pid][0]
        if ids.shape != allowed.shape[:1] or ids.dtype != torch.int64:
            return False, f"ids {tuple(ids.shape)} {ids.dtype}, expected ({allowed.shape[0]},) int64"
        in_range = (ids >= 0) & (ids < allowed.shape[1])
        ok = in_range.clone()
        ok[in_range] = allowed[in_range.nonzero()[:, 0], ids[in_range]]
        bad = (~ok).nonzero()[:, 0].tolist()
        if bad:
            t = bad[0]
            want = allowed[t].nonzero()[:, 0].tolist()
            return False, (f"{len(bad)}/{len(ids)} ids differ from the float64 Gumbel-max "
                           f"(row {t}: {int(ids[t])}, want {want})")
        return True, f"{len(ids)} ids equal the float64 Gumbel-max of the same noise"

    plan.check(f"{name}/accuracy", "accuracy", fn)


def chi2_quantile(df: int, z: float = CHI2_Z) -> float:
    """Wilson–Hilferty approximation of the χ² quantile with df degrees of freedom."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, int]:
    """χ² statistic and degrees of freedom of `counts` against n·probs, pooling ids expected < 5 times."""
    expected = probs * n
    big = expected >= 5
    obs = [counts[big].double()]
    exp = [expected[big]]
    if (~big).any():
        obs.append(counts[~big].double().sum()[None])
        exp.append(expected[~big].sum()[None])
    o, e = torch.cat(obs), torch.cat(exp)
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    extra = float(o[~keep].sum())  # draws where the reference gives probability 0
    return (math.inf if extra else stat), max(1, int(keep.sum()) - 1)


def _distribution_check(plan: Plan, name: str, H: int, V: int, temperature: float, draws: tuple[int, int],
                        gen: torch.Generator, w: torch.Tensor | None = None) -> None:
    rows, n = draws
    hidden, w_new = hidden_and_weight(rows, H, V if w is None else 1, gen)
    w = w_new if w is None else w
    rep = torch.arange(rows).repeat_interleave(n)
    seeds = _seeds(rows * n, gen)
    pid = plan.add(Probe(f"{name}/draws[{rows}x{n}]", "sample", (hidden[rep], w, temperature, seeds)))
    probs = logits_ref(hidden.double(), w.double(), temperature).softmax(-1).cpu()

    def fn(res: Results, pid=pid, probs=probs):
        ids = res[pid][0]
        if ids.shape != (rows * n,) or ids.dtype != torch.int64 or ids.min() < 0 or ids.max() >= V:
            return False, f"ids {tuple(ids.shape)} {ids.dtype} out of shape or range"
        worst = 0.0
        for r in range(rows):
            counts = torch.bincount(ids[r * n : (r + 1) * n], minlength=V)
            stat, df = chi2(counts, probs[r], n)
            limit = chi2_quantile(df)
            worst = max(worst, stat / limit)
            if stat > limit:
                return False, f"row {r}: χ² {stat:.1f} > {limit:.1f} (df {df}, p = 1e-6)", stat
        return True, f"{rows} rows × {n} draws: χ²/limit ≤ {worst:.2f}"

    plan.check(f"{name}/distribution", "distribution", fn)


def build_plan(profile: str, seed: int) -> Plan:
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"unknown profile {profile!r}")
    sizes = CPU_SIZES if profile == "cpu" else GPU_SIZES
    draws = CPU_DRAWS if profile == "cpu" else GPU_DRAWS
    rng = random.Random(seed)
    plan = Plan()
    for i, (name, H, V, tau) in enumerate(shapes(profile)):
        w = hidden_and_weight(1, H, V, torch.Generator().manual_seed(rng.randrange(2**31)))[1]
        cfgs = [config(name, H, V, tau, w)]
        # the interpreter is slow: the CPU profile checks greedy (and draws) on its first shape only
        if profile == "gpu" or i == 0:
            cfgs.append(config(f"{name}/greedy", H, V, 0.0, w))
        plan.extend(tokenwise_plan("sample", cfgs, sizes, rng.randrange(2**31)))
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        for cfg in cfgs:
            _accuracy_check(plan, cfg.name, cfg.make_inputs(max(sizes), gen))
        if profile == "gpu" or i == 0:
            _distribution_check(plan, name, H, V, tau, draws, gen, w)
    return plan


def cells(profile: str) -> list[Cell]:
    """Sampling runs once per rollout decode step: the decode batch sizes."""
    return lmhead_cells(profile, DECODE_BATCHES)


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    hidden, w, tau = bench_inputs(cell, seed, device)
    gen = torch.Generator().manual_seed(seed + 1)
    seeds = _seeds(hidden.shape[0], gen).to(device)

    def baseline():
        return torch.multinomial(torch.softmax((hidden @ w.T).float() / tau, -1), 1)[:, 0]

    return BenchCase(
        entry="sample",
        args=(hidden, w, tau, seeds),
        baseline=baseline,
        bytes_moved=lmhead_bytes(hidden, w, 8 + 8),
        flops=2 * hidden.shape[0] * w.shape[0] * w.shape[1],
        token_args=(0, 3),
    )


CONTRACT = Contract(
    op="sample",
    entries=("sample",),
    impl="tik_kernels.ops.sample",
    summary="fused lm_head + seeded Gumbel-max sampling (temperature 0: greedy); same seed, same token in any batch",
    requirements=REQUIREMENTS,
    tolerances={},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
    used_in_training=False,
)
