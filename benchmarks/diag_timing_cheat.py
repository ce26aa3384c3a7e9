"""What the evaluator's timing integrity check sees for the planted timing cheats and an honest
candidate (GPU): per cell, the profiler summary of the candidate and root calls (kernels, kernel µs,
event window µs, kernels overlapping the spin), event and wall medians, and the check's verdict.

    PYTHONPATH=. python benchmarks/diag_timing_cheat.py --out benchmarks/results/diag_timing_cheat_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "evaluator")]

from evaluator_fixtures import FIX, tiny  # noqa: E402

import tik_kernels  # noqa: E402,F401
from tik_kernels.evaluator import evaluate, measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fixtures", nargs="+", default=["side_stream", "good", "lazy_gpu"])
    args = ap.parse_args()
    seen: list[dict] = []
    real = measure.integrity_ok

    def spy(c, control):
        ok, why = real(c, control)
        s = c["samples"]
        seen.append({
            "profile": c.get("profile"),
            "event_median_us": {k: statistics.median(v["event_us"]) for k, v in s.items() if "event_us" in v},
            "wall_median_us": {k: statistics.median(v["wall_us"]) for k, v in s.items() if "wall_us" in v},
            "verdict": [ok, why],
        })
        return ok, why

    measure.integrity_ok = spy
    doc = {}
    for name in args.fixtures:
        seen.clear()
        rep = evaluate(tiny(), FIX / f"{name}.py", root_path=FIX / "tiny_root.py", device="cuda", time_it=True)
        doc[name] = {"verified": rep.verified, "failure": rep.failure,
                     "checks": [(c.name, c.passed, c.detail) for c in rep.checks], "cells": list(seen)}
        print(name, rep.verified, rep.failure, flush=True)
        for cell in seen:
            print("   ", json.dumps(cell)[:600], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
