"""A small workspace built through the real store API, and helpers to drive the app.

Times are frozen (the store's clock is patched while building, the app gets a fixed clock) so
that snapshots are byte-stable."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

#: 2026-12-02 12:00:00 UTC
T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
NOW = T0.timestamp() + 3600

SRC = '''"""rmsnorm: one program per row; the reduction order never depends on T."""
import triton
import triton.language as tl

CONFIG = {{"BLOCK_N": {block}, "num_warps": {warps}}}


@triton.jit
def _rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, H, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    o_n = tl.arange(0, BLOCK_N)
    b_x = tl.load(x_ptr + row * H + o_n, mask=o_n < H, other=0.0).to(tl.float32)
    b_r = tl.rsqrt(tl.sum(b_x * b_x, axis=0) / H + eps)
    tl.store(y_ptr + row * H + o_n, b_x * b_r, mask=o_n < H)
'''

CELLS = ("decode_T1", "prefill_T512", "train_T4096")


def report(verified: bool, eligible: bool = False, ratios=(1.0, 1.0, 1.0), inc=None, fail_check: str | None = None):
    """An EvalReport-shaped dict: root medians 10/40/100 µs, the candidate at `ratios` of them."""
    root = (10.0, 40.0, 100.0)
    checks = [
        {"name": "batch_invariance", "requirement": "rows equal across T", "passed": fail_check != "batch_invariance",
         "detail": "row 3 differs at T=7" if fail_check == "batch_invariance" else "16 sizes bit-equal",
         "max_diff": 0.0078 if fail_check == "batch_invariance" else 0.0},
        {"name": "accuracy", "requirement": "vs float64 within 2x torch", "passed": True,
         "detail": "rel rms 3.1e-3", "max_diff": 0.0039},
        {"name": "batch_invariance[permuted]", "requirement": "rows equal across permutations", "passed": True,
         "detail": "16 permutations bit-equal", "max_diff": 0.0},
        {"name": "deterministic", "requirement": "rerun equal", "passed": True, "detail": "", "max_diff": 0.0},
    ]
    cells = []
    if verified:
        for name, r0, ratio, i in zip(CELLS, root, ratios, inc or (None, None, None), strict=True):
            cells.append({"cell": name, "coeff": 1.0, "limit": 0.05, "median_us": r0 * ratio, "spread_us": 0.1,
                          "samples": 20, "root_median_us": r0, "incumbent_median_us": i,
                          "baseline_median_us": r0 * 0.8, "ratio_vs_root": ratio, "ratio_vs_baseline": ratio / 0.8})
    obj = sum(c["median_us"] for c in cells) if cells else None
    return {"op": "rmsnorm", "verified": verified, "failure": None if verified else f"{fail_check} failed",
            "checks": checks, "cells": cells, "admissible": verified and all(r <= 1.05 for r in ratios),
            "objective": obj, "incumbent_objective": (sum(inc) if inc else 150.0) if verified else None,
            "eligible": eligible,
            "env": {"device": "cpu", "gpu": None, "driver": None, "torch": "2.13", "triton": "3.9", "python": "3.11"},
            "contract_fingerprint": "fp-rmsnorm", "source_sha256": "x", "elapsed_s": 1.5}


@pytest.fixture
def frozen_store_clock(monkeypatch):
    import tik_store.workspace as sw

    ticks = itertools.count()
    monkeypatch.setattr(sw, "now", lambda: (T0 + timedelta(seconds=next(ticks))).isoformat(
        timespec="milliseconds").replace("+00:00", "Z"))


def build_workspace(path: Path) -> dict[str, int]:
    """Three operators; rmsnorm has a lineage with every status. Returns name -> implementation id."""
    from tik_store import Workspace

    ids: dict[str, int] = {}
    with Workspace.init(path) as ws:
        for op in ("rmsnorm", "linear", "logprob"):
            ws.ensure_operator(op, f"{op} summary", {"op": op}, f"fp-{op}")
        ids["root"] = ws.add_implementation("rmsnorm", SRC.format(block=128, warps=4), proposer="library",
                                            rationale="the library's root", status="verified")
        ws.record_evaluation(ids["root"], report(True))
        ids["failed"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=64, warps=4), parents=[ids["root"]], proposer="tuner",
            rationale="BLOCK_N 64: smaller tiles for decode", modification={"numerical_risks": "none"})
        ws.record_evaluation(ids["failed"], report(False, fail_check="batch_invariance"))
        ids["promoted"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=256, warps=4), parents=[ids["root"]], proposer="tuner",
            rationale="BLOCK_N 256: fewer programs", modification={"expected_effect": "-5% on prefill"})
        ws.record_evaluation(ids["promoted"], report(True, True, (0.95, 0.95, 0.95)))
        ws.decide(ids["promoted"], "promote", by="test", reason="faster everywhere")
        ids["verified"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=256, warps=8), parents=[ids["promoted"]], proposer="tuner",
            rationale="8 warps")
        ws.record_evaluation(ids["verified"], report(True, False, (0.97, 0.96, 0.99), inc=(9.5, 38.0, 95.0)))
        ids["eligible"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=512, warps=8), parents=[ids["verified"]], proposer="claude",
            rationale="one program covers H=4096 in one tile; same reduction order per row",
            modification={"expected_effect": "-10% prefill", "numerical_risks": "none: per-row sum unchanged"},
            usage={"model": "claude-sonnet", "input_tokens": 12000, "output_tokens": 1800, "cost_usd": 0.063})
        ws.record_evaluation(ids["eligible"], report(True, True, (0.92, 0.88, 0.90), inc=(9.5, 38.0, 95.0)))
        ids["rejected"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=512, warps=4), parents=[ids["promoted"]], proposer="tuner",
            rationale="512/4")
        ws.record_evaluation(ids["rejected"], report(True, True, (0.93, 1.04, 0.93)))
        ws.decide(ids["rejected"], "reject", by="test", reason="too close to the decode limit")
        ids["inadmissible"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=2048, warps=8), parents=[ids["promoted"]], proposer="tuner",
            rationale="2048/8: one tile per row")
        ws.record_evaluation(ids["inadmissible"], report(True, False, (0.85, 1.143, 0.80), inc=(9.5, 38.0, 95.0)))
        ids["candidate"] = ws.add_implementation(
            "rmsnorm", SRC.format(block=1024, warps=8), parents=[ids["eligible"]], proposer="tuner",
            rationale="1024/8")
        ids["linear_root"] = ws.add_implementation("linear", "def linear(x, w):\n    return x @ w.T\n",
                                                   proposer="library", status="verified")
        ids["logprob_root"] = ws.add_implementation("logprob", "def logprob(h, w, t, temp):\n    ...\n",
                                                    proposer="library", status="verified")
        ws.append_event("error", {"message": "evaluator timed out on #7 after 60 s"}, op="rmsnorm")
        ws.set_worker_state(pid=4242, host="gpu-box", state="running", op="rmsnorm", proposer="tuner", budget=10,
                            spent=6,
                            heartbeat=NOW - 5, message=f"evaluating #{ids['candidate']}")
    return ids


@pytest.fixture
def workspace(tmp_path, monkeypatch, frozen_store_clock):
    """(path, ids): the built workspace, with the working directory at its parent."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "ws"
    return path, build_workspace(path)


def make_app(path: Path, **kwargs):
    from tik_tui.app import TikApp
    from tik_tui.config import UiConfig

    kwargs.setdefault("config", UiConfig(theme="textual-dark", poll_interval=0.1))
    return TikApp(path, clock=lambda: NOW, **kwargs)


async def wait_for(pilot, predicate, timeout: float = 10.0) -> None:
    """Pause the pilot until `predicate()` holds (the store answers on its own thread)."""
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError("timed out waiting for the UI")
        await pilot.pause(0.05)
