"""benchmarks/bench_eval_rate.py's report: each evaluation after the first is listed with its wait for a
pre-started child, since a median of two hid an alternation of 0 s and 5-10 s waits (docs/MEASUREMENTS.md, session
36). Read from a run kept in benchmarks/results."""

import json
from pathlib import Path

from benchmarks.bench_eval_rate import markdown

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "eval_rate_h100_s36_before.json"


def test_the_report_lists_each_evaluation_after_the_first_with_its_wait():
    text = markdown(json.loads(RUN.read_text()))
    line = next(ln for ln in text.splitlines() if ln.startswith("Each evaluation after the first"))
    assert "linear: 14.7 [0.0], 22.6 [5.4]." in line
    assert "attention: 14.2 (not verified) [0.0], 22.5 (not verified) [9.3]." in line
    assert "| rmsnorm | 53.6 | **15.4** (15.4: 2) |" in text
