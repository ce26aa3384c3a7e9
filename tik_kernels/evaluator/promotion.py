"""Is a measured gain beyond the noise? A paired bootstrap confidence interval of the objective ratio.

One timing run times candidate and incumbent in the same rounds (interleaved, in random order), so round r
of the candidate and round r of the incumbent saw the same clocks, the same neighbours and the same drift.
Resampling whole rounds (the pair together) keeps that pairing: noise both sides share cancels in the ratio,
noise of one side only widens the interval. The statistic is the report's own objective ratio,
Σ coeff · median(candidate) / Σ coeff · median(incumbent), recomputed on every resample of every cell's
rounds; the interval is its percentile interval. A promotion needs the whole interval below 1 - MIN_GAIN.

Why this rather than a fixed margin from the root timed against itself: that spread depends on the rounds
and the cells (3.1% at 15 rounds, 0.15% at 100 on the H200's rmsnorm cells), so a margin measured once is
wrong for the next operator or round count, and measuring it in every run costs a fourth implementation per
round. The interval is computed from the run's own samples, shrinks as rounds are added, and needs nothing
timed twice. What it cannot see is a bias common to every round of a run (one process's memory placement,
the order the implementations were imported in): the root timed against itself came out up to 0.15% off per
cell at 100 rounds. MIN_GAIN covers that with margin, and makes a 1.005x "gain" (two such were promoted)
ineligible however many rounds measured it: each promotion moves the incumbent every later candidate is held to.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: two-sided confidence of the interval; promotion needs its upper end below 1 (a 97.5% one-sided bound)
CONFIDENCE = 0.95
#: the smallest gain worth a promotion: the interval's upper end must be below 1 - MIN_GAIN
MIN_GAIN = 0.01
#: bootstrap resamples (the interval's ends move by ~0.1% between seeds at this count; ~20 ms per 100-round cell)
RESAMPLES = 1000


def objective_ratio_ci(cells: Sequence[tuple[float, Sequence[float], Sequence[float]]], *, seed: int = 0,
                       resamples: int = RESAMPLES, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile interval of Σ coeff · median(cand) / Σ coeff · median(inc) over paired bootstrap resamples.

    `cells`: (coeff, candidate samples, incumbent samples), sample r of both taken in the same round.
    None when a cell has no paired sample (nothing to decide on)."""
    gen = torch.Generator().manual_seed(seed)
    num = torch.zeros(resamples, dtype=torch.float64)
    den = torch.zeros(resamples, dtype=torch.float64)
    for coeff, cand, inc in cells:
        n = min(len(cand), len(inc))
        if n == 0:
            return None
        c = torch.tensor(list(cand[:n]), dtype=torch.float64)
        i = torch.tensor(list(inc[:n]), dtype=torch.float64)
        idx = torch.randint(0, n, (resamples, n), generator=gen)
        num += coeff * c[idx].median(dim=1).values
        den += coeff * i[idx].median(dim=1).values
    if not cells or not bool((den > 0).all()):
        return None
    ratio = num / den
    tail = (1.0 - confidence) / 2
    lo, hi = torch.quantile(ratio, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return lo, hi

