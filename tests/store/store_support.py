"""Shared pieces for the store's tests: a fresh workspace with one toy operator, and EvalReport dicts."""

from __future__ import annotations

import pytest

from tik_store import Workspace

TOY = "def toy(x):\n    return x\n"


def toy_source(i: int) -> str:
    """A distinct, parseable implementation file per i."""
    return f"CONFIG = {{'BLOCK': {i}}}\n\n\ndef toy(x):\n    return x * {i}\n"


def report(verified: bool = True, eligible: bool = False, objective: float | None = 10.0,
           failure: str | None = None, checks: list[dict] | None = None) -> dict:
    """An `EvalReport.as_dict()` as INTERFACES.md describes it."""
    if checks is None:
        checks = [{"name": "batch_invariance/T=3", "requirement": "batch_invariant", "passed": verified,
                   "detail": "" if verified else "row 2 differs", "max_diff": 0.0 if verified else 0.5},
                  {"name": "deterministic", "requirement": "deterministic", "passed": True, "detail": "",
                   "max_diff": 0.0}]
    return {
        "op": "toy", "verified": verified, "failure": failure if failure or verified else "batch_invariance/T=3",
        "checks": checks,
        "cells": [{"cell": "T=1", "coeff": 1.0, "limit": 0.05, "median_us": objective, "spread_us": 0.2,
                   "samples": 20, "root_median_us": 12.0, "incumbent_median_us": 11.0, "baseline_median_us": 9.0,
                   "ratio_vs_root": None if objective is None else objective / 12.0, "ratio_vs_baseline": None}],
        "admissible": verified, "objective": objective, "incumbent_objective": 11.0, "eligible": eligible,
        "env": {"device": "cuda", "gpu": "NVIDIA H200", "driver": "570.1", "torch": "2.11.0", "triton": "3.6.0",
                "python": "3.11.7"},
        "contract_fingerprint": "abc123", "source_sha256": "0" * 64, "elapsed_s": 1.5,
    }


@pytest.fixture
def ws(tmp_path):
    w = Workspace.init(tmp_path / "ws")
    w.ensure_operator("toy", "a toy operator", {"entries": ["toy"]}, "fp-1")
    yield w
    w.close()


@pytest.fixture
def root(ws):
    impl = ws.add_implementation("toy", TOY, proposer="root", rationale="the root", status="promoted")
    ws.decide(impl, "promote", by="library")
    return impl
