"""`sweep_linear`'s reading of the root's combine choice: CONFIG's launch for a bucket is timed with the combine the
entry point uses at the bucket's rows (FUSED_COMBINE up to FUSED_MAX_M rows), and the suggestion sets the two keys
from the buckets' best launches. Until session 45 the sweep timed every split bucket with FUSED_COMBINE alone, so its
"CONFIG's launch" at M = 64 was the fused combine the entry point does not use there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sweep_linear as S  # noqa: E402

import tik_kernels.ops.linear as L  # noqa: E402


def test_config_launch_uses_the_entry_point_s_combine(monkeypatch):
    monkeypatch.setitem(L.CONFIG, "FUSED_COMBINE", 1)
    monkeypatch.setitem(L.CONFIG, "FUSED_MAX_M", 16)
    assert [S.config_fused(b) for b in ("M16", "M64", "M256", "MBIG")] == [True, False, False, False]
    first, *_, other = S.candidates("M64")
    assert S.label(*first).endswith(",kernel") and S.label(*other).endswith(",fused")
    monkeypatch.setitem(L.CONFIG, "FUSED_COMBINE", 0)
    assert not S.config_fused("M16")


@pytest.mark.parametrize("best,want", [
    ({"M16": True, "M64": False}, {"FUSED_COMBINE": 1, "FUSED_MAX_M": 16}),
    ({"M16": True, "M64": True}, {"FUSED_COMBINE": 1, "FUSED_MAX_M": 64}),
    ({"M16": False, "M64": False}, {"FUSED_COMBINE": 0}),
    ({"M256": True}, {"FUSED_COMBINE": 1, "FUSED_MAX_M": 256}),
])
def test_suggested_combine_covers_the_largest_fused_bucket(best, want):
    assert S.suggested_combine(best) == want


def test_twins_pair_k_unroll_2_wgmma_tiles_with_their_k_unroll_1_twin():
    import sweep_twins

    choice = {"M64": {"all": {"64,64,4,4,2,4,fused": 1.3, "64,64,4,4,1,4,fused": 1.2, "64,64,4,4,1,4,kernel": 1.1,
                              "16,64,4,4,2,4,fused": 1.0, "16,64,4,4,1,4,fused": 1.4, "64,32,4,6,2,0": 1.5}}}
    # 16-row tiles (mma.sync) are not wgmma tiles; a launch without its twin is left out
    assert sweep_twins.twins(choice) == [("M64", "64,64,4,4,2,4,fused", 1.3, 1.2)]
    # a run that swapped the bucket times one launch under both labels
    assert sweep_twins.twins(choice, {"M64_SWAP": 1, "M16_SWAP": 0}) == []
