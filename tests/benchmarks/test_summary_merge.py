"""benchmarks/summary_merge.py: the summaries several GPU calls brought back, merged key by key by provenance date."""

from __future__ import annotations

import json

from benchmarks.summary_merge import main, merge


def _summary(**keys):
    """{key: (value, date, file)} as harness.update_summary writes it."""
    return {"_note": "n", **{k: v for k, (v, _, _) in keys.items()},
            "_provenance": {k: {"command": "c", "date": d, "file": f} for k, (_, d, f) in keys.items()}}


def test_each_key_comes_from_its_latest_run_and_an_old_value_carried_back_changes_nothing():
    repo = _summary(a=(1.0, "2026-12-06 10:00:00 UTC", "benchmarks/results/a_s32.json"),
                    b=(2.0, "2026-12-06 10:00:00 UTC", "benchmarks/results/b_s32.json"))
    # call 1 wrote a; call 2 started from the repository's copy, so it carries a's old value back, and wrote b, c
    call1 = _summary(a=(1.5, "2026-12-06 16:00:00 UTC", "/tmp/r/a.json"),
                     b=(2.0, "2026-12-06 10:00:00 UTC", "benchmarks/results/b_s32.json"))
    call2 = _summary(a=(1.0, "2026-12-06 10:00:00 UTC", "benchmarks/results/a_s32.json"),
                     b=(2.5, "2026-12-06 16:10:00 UTC", "/tmp/r/b.json"),
                     c=(3.0, "2026-12-06 16:10:00 UTC", "/tmp/r/c.json"))
    out, changed = merge(repo, [call1, call2], {"/tmp/r/a.json": "benchmarks/results/a_s33.json"})
    assert (out["a"], out["b"], out["c"]) == (1.5, 2.5, 3.0)
    assert out["_provenance"]["a"]["file"] == "benchmarks/results/a_s33.json"
    assert out["_provenance"]["b"]["file"] == "/tmp/r/b.json"  # not renamed: the command line warns about it
    assert len(changed) == 3 and changed[0].startswith("a: 1.0 -> 1.5")
    # the order of the copies does not matter, and the repository's summary is not modified in place
    assert merge(repo, [call2, call1], {"/tmp/r/a.json": "benchmarks/results/a_s33.json"})[0] == out
    assert repo["a"] == 1.0


def test_the_command_rewrites_the_summary_and_warns_of_files_not_saved(tmp_path, capsys):
    into = tmp_path / "summary_h100.json"
    into.write_text(json.dumps(_summary(a=(1.0, "2026-12-06 10:00:00 UTC", "README.md"))))
    got = tmp_path / "call.json"
    got.write_text(json.dumps(_summary(a=(0.9, "2026-12-06 17:00:00 UTC", "/tmp/r/gone.json"),
                                       b=(4.0, "2026-12-06 17:00:00 UTC", "/tmp/r/kept.json"))))
    assert main([str(got), "--into", str(into), "--rename", "/tmp/r/kept.json=README.md"]) == 0
    doc = json.loads(into.read_text())
    assert (doc["a"], doc["b"], doc["_provenance"]["b"]["file"]) == (0.9, 4.0, "README.md")
    err = capsys.readouterr().err
    assert "a's file /tmp/r/gone.json is not in the repository" in err and "b's file" not in err
    assert main([str(got), "--into", str(into), "--rename", "no-equals-sign"]) == 2
    assert main([str(tmp_path / "missing.json"), "--into", str(into)]) == 2
