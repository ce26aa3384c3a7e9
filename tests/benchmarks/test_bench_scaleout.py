"""benchmarks/bench_scaleout.py on the CPU with timing on (`--time`): a row splits the search's wall into its
evaluations and the tuner's screens, and says where the evaluations waited; benchmarks/devlock_model.py runs."""

from __future__ import annotations

import json

from benchmarks import bench_scaleout, devlock_model


def test_a_row_splits_the_wall_into_evaluations_and_screens(tmp_path):
    out = tmp_path / "scaleout.json"
    assert bench_scaleout.main(["--op", "rmsnorm", "--evals", "2", "--gpus", "1", "--device", "cpu", "--time",
                                "--out", str(out)]) == 0
    row = json.loads(out.read_text())["runs"][0]
    assert row["evaluations"] == 2
    # timed candidates: the tuner screened configs before its proposals, outside every evaluation's span
    assert row["screens"] >= 1 and row["screened_configs"] >= 2 and row["screen_s_total"] > 0
    assert row["judged_per_hour"] > row["evals_per_hour"]
    assert row["eval_s_total"] + row["screen_s_total"] <= row["wall_s"] + 1.0
    assert row["first_eval_start_s"] >= 0 and row["after_last_eval_s"] >= 0
    assert "timing_child" in row["phase_medians"] and "probes_candidate" in row["phase_medians"]
    md = out.with_suffix(".md").read_text()
    header, rule, line = md.split("\n\n")[3].splitlines()[:3]
    assert header.count("|") == rule.count("|") == line.count("|")
    assert "seconds in evaluations / screens" in header


def test_no_screens_without_timing(tmp_path):
    out = tmp_path / "scaleout.json"
    assert bench_scaleout.main(["--op", "rmsnorm", "--evals", "1", "--gpus", "1", "--device", "cpu", "--out",
                                str(out)]) == 0
    row = json.loads(out.read_text())["runs"][0]
    assert row["screens"] == 0 and row["screen_s_total"] == 0 and row["evals_per_hour_steady"] is None


def test_the_lock_model_runs_one_and_two_processes():
    one = devlock_model.run(1, 2, 0.05, 0.01, 0.01, 1)
    two = devlock_model.run(2, 2, 0.05, 0.01, 0.01, 1)
    assert one["processes"] == 1 and two["processes"] == 2
    assert one["max_wait_s"] < 0.5 and two["wall_s"] > 0
