"""`EvalReport`, the decision rules of docs/ARCHITECTURE.md, and the environment and code fingerprints a
result is bound to."""

from __future__ import annotations

import functools
import hashlib
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tik_kernels.contract import CheckResult
from tik_kernels.evaluator.promotion import MIN_GAIN


@dataclass
class EvalReport:
    op: str
    verified: bool
    failure: str | None
    checks: list[CheckResult] = field(default_factory=list)
    #: one dict per workload cell, keys as in docs/INTERFACES.md
    cells: list[dict] = field(default_factory=list)
    admissible: bool | None = None
    objective: float | None = None
    incumbent_objective: float | None = None
    #: percentile interval of objective / incumbent_objective over paired bootstrap resamples of the timed
    #: rounds (`promotion.objective_ratio_ci`); eligibility needs its upper end below 1
    objective_ci: list[float] | None = None
    eligible: bool | None = None
    env: dict = field(default_factory=dict)
    contract_fingerprint: str = ""
    source_sha256: str = ""
    elapsed_s: float = 0.0
    #: hash of the evaluator's own code and the contract framework
    evaluator_fingerprint: str = ""
    profile: str = ""
    seed: int = 0
    #: "gpu" (CUDA events), "interpreter" (CPU wall times, never comparable with GPU ones) or None
    timing: str | None = None
    floor_us: float | None = None
    #: seconds per phase of this evaluation (children's runs, checks, timing), for finding where the time goes; a few
    #: entries are counts or flags, named so (`*_compiled`, `*_kernels`, `*_cached`, `*_workers`, `*_failed`, `*_mb`,
    #: `*_forked`; `checks_overlapped`: 1.0 when the checks ran while the candidate was timed)
    phases: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "verified": self.verified,
            "failure": self.failure,
            "checks": [c.as_dict() for c in self.checks],
            "cells": self.cells,
            "admissible": self.admissible,
            "objective": self.objective,
            "incumbent_objective": self.incumbent_objective,
            "objective_ci": self.objective_ci,
            "eligible": self.eligible,
            "env": self.env,
            "contract_fingerprint": self.contract_fingerprint,
            "source_sha256": self.source_sha256,
            "elapsed_s": round(self.elapsed_s, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "evaluator_fingerprint": self.evaluator_fingerprint,
            "profile": self.profile,
            "seed": self.seed,
            "timing": self.timing,
            "floor_us": self.floor_us,
        }


def fail(report: EvalReport, name: str, requirement: str, reason: str) -> None:
    """Record a failure that stops the evaluation: the report's one-line reason and a failed check."""
    report.failure = reason[:300]
    report.checks.append(CheckResult(name, requirement, False, reason[:300]))


def decide(report: EvalReport) -> None:
    """Fill admissible / objective / eligible from the checks and the timed cells.

    admissible: verified, every cell timed, and no cell slower than root × (1 + its limit).
    objective: Σ coeff · median over the cells; the incumbent's is measured in the same run.
    eligible: admissible, objective strictly below the incumbent's, and the gain beyond the noise: the upper end
    of `objective_ci` (paired bootstrap interval of objective / incumbent objective) below 1 - MIN_GAIN
    (`promotion.py` says why). A report without that interval (no paired rounds) is never eligible.
    """
    report.verified = report.failure is None and bool(report.checks) and all(c.passed for c in report.checks)
    if not report.verified and report.failure is None:
        failed = [c for c in report.checks if not c.passed]
        report.failure = (f"{failed[0].name}: {failed[0].detail}"[:300] if failed else "no checks ran")
    if not report.cells:
        return
    timed = all(c.get("median_us") is not None and c.get("root_median_us") is not None for c in report.cells)
    if not timed:
        report.admissible = False
        report.eligible = False
        return
    report.objective = sum(c["coeff"] * c["median_us"] for c in report.cells)
    if all(c.get("incumbent_median_us") is not None for c in report.cells):
        report.incumbent_objective = sum(c["coeff"] * c["incumbent_median_us"] for c in report.cells)
    report.admissible = report.verified and all(
        c["median_us"] <= c["root_median_us"] * (1.0 + c["limit"]) for c in report.cells)
    report.eligible = bool(report.admissible and report.incumbent_objective is not None
                           and report.objective < report.incumbent_objective
                           and report.objective_ci is not None and report.objective_ci[1] < 1.0 - MIN_GAIN)


@functools.cache
def _driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=15)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment(device: str) -> dict[str, Any]:
    """What a measurement depends on besides the code: a report from another environment is not reused."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # triton missing or broken: recorded, not fatal
        triton_version = None
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    return {
        "device": device,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "driver": _driver() if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "interpreter": not cuda,
    }


@functools.cache
def evaluator_fingerprint() -> str:
    """Hash of this package's code and the contract framework (sorted by file name)."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(here.glob("*.py")) + sorted((here.parent / "contract").glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]
