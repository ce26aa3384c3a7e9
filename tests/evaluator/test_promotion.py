"""A promotion needs a gain beyond the measured noise: the paired bootstrap interval on synthetic rounds."""

import torch

from tik_kernels.evaluator.promotion import MIN_GAIN, objective_ratio_ci


def _rounds(gain: float, noise: float, rounds: int = 100, cells: int = 7, seed: int = 0, shared: float = 0.0):
    """Per cell (coeff, candidate, incumbent): the incumbent's time / gain, each sample off by `noise` (relative
    standard deviation), plus `shared` noise both sides of a round see (a clock change, a busy neighbour)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in range(cells):
        base = 4.0 * (c + 1)
        common = 1 + shared * torch.randn(rounds, generator=g)
        inc = base * common * (1 + noise * torch.randn(rounds, generator=g))
        cand = base / gain * common * (1 + noise * torch.randn(rounds, generator=g))
        out.append((1.0 / base, cand.tolist(), inc.tolist()))
    return out


def _eligible(ci) -> bool:
    return ci is not None and ci[1] < 1.0 - MIN_GAIN


def test_a_tiny_gain_in_noise_is_not_eligible():
    for seed in range(3):
        ci = objective_ratio_ci(_rounds(1.005, 0.03, seed=seed), seed=seed)
        assert ci[0] < 1 / 1.005 < ci[1] and not _eligible(ci), ci
    # 15 rounds (where the root timed against itself moved by 3%): the interval is wider still
    ci = objective_ratio_ci(_rounds(1.005, 0.03, rounds=15))
    assert ci[1] > 1.0 and not _eligible(ci), ci


def test_a_clear_gain_is_eligible():
    for seed in range(3):
        ci = objective_ratio_ci(_rounds(1.10, 0.01, seed=seed), seed=seed)
        assert ci[0] < 1 / 1.10 < ci[1] and _eligible(ci), ci


def test_pairing_cancels_noise_both_sides_share():
    # 5% noise common to both sides of a round, 0.5% of their own: a 3% gain stands out only when paired
    ci = objective_ratio_ci(_rounds(1.03, 0.005, rounds=30, cells=1, shared=0.05))
    assert _eligible(ci) and ci[1] - ci[0] < 0.02, ci


def test_no_paired_rounds_no_interval():
    assert objective_ratio_ci([(1.0, [], [1.0])]) is None
    assert objective_ratio_ci([]) is None
