"""The e2e throughput ratios: B / C paired over the phases B and C share (the same kernels, the same tokens), so
noise between the two runs' identical phases cancels; the unpaired ratios divide the runs' steps/s."""

from __future__ import annotations

import pytest

from tik_kernels.e2e.run import speedups


def _mode(rollout: float, recompute: float, train: float, steps: int = 2) -> dict:
    return {"steps_per_s": steps / (rollout + recompute + train),
            "time_s": {"rollout": rollout, "recompute": recompute, "train": train}}


def test_paired_b_over_c_ignores_noise_in_the_shared_phases():
    c = _mode(2.0, 0.4, 2.0)
    quiet = speedups({"B": _mode(2.0, 0.0, 2.0), "C": c})
    assert quiet["B_over_C"] == pytest.approx(4.4 / 4.0) == pytest.approx(quiet["B_over_C_paired"])
    # B's identical phases 10% faster than C's (run order, clocks): the unpaired ratio takes that for a speedup
    noisy = speedups({"B": _mode(1.8, 0.0, 1.8), "C": c})
    assert noisy["B_over_C"] == pytest.approx(4.4 / 3.6)
    assert noisy["B_over_C_paired"] == pytest.approx((3.8 + 0.4) / 3.8)


def test_ratios_need_both_modes():
    assert speedups({"B": _mode(1.0, 0.0, 1.0)}) == {}
    assert set(speedups({"A": _mode(3.0, 0.5, 3.0), "B": _mode(1.0, 0.0, 1.0)})) == {"B_over_A"}
