"""benchmarks/bench_scaleout_side.py: the two checkouts' runs interleaved (the order alternating by round), every
run kept, medians and their ratio per op and worker count; a bad base or --ops is a one-line error."""

import json
import textwrap

from benchmarks import bench_scaleout_side as S

FAKE = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    a = sys.argv
    op, out, who = a[a.index("--op") + 1], Path(a[a.index("--out") + 1]), Path(__file__).parents[1].name
    log = Path(__file__).with_name("calls.txt")
    log.write_text(log.read_text() + who + "\\n" if log.exists() else who + "\\n")
    n = len(log.read_text().split())
    rate = {"base": 100.0, "tree": 400.0}[who] + n  # a different figure each run
    out.write_text(json.dumps({"runs": [{"gpus": 1, "evals_per_hour": rate},
                                        {"gpus": 2, "evals_per_hour": 2 * rate}]}))
''')


def _tree(root, name):
    (root / name / "benchmarks").mkdir(parents=True)
    (root / name / "benchmarks" / "bench_scaleout.py").write_text(FAKE)
    return root / name


def test_runs_alternate_and_the_summary_is_the_medians(tmp_path, monkeypatch):
    base, tree = _tree(tmp_path, "base"), _tree(tmp_path, "tree")
    monkeypatch.setattr(S, "HERE", tree)
    out = tmp_path / "side.json"
    assert S.main(["--base", str(base), "--ops", "linear:4", "--rounds", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["round"], r["side"]) for r in doc["runs"]] == [(1, "base"), (1, "tree"), (2, "tree"), (2, "base"),
                                                             (3, "base"), (3, "tree")]
    [one, two] = doc["summary"]
    # each side's log counts its own calls: base runs 1, 2, 3 -> 101, 102, 103; tree 401, 402, 403
    assert one == {"op": "linear", "workers": 1, "base": [101.0, 102.0, 103.0], "tree": [401.0, 402.0, 403.0],
                   "base_median": 102.0, "tree_median": 402.0, "ratio": round(402 / 102, 2)}
    assert two["workers"] == 2 and two["ratio"] == round(804 / 204, 2)
    md = out.with_suffix(".md").read_text()
    assert "| linear (4) | 1 | 102 (101, 102, 103) | 402 (401, 402, 403) | **3.94×** |" in md


def test_a_bad_base_or_ops_is_one_line(tmp_path, capsys):
    assert S.main(["--base", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("has no benchmarks/bench_scaleout.py")
    base = _tree(tmp_path, "base")
    assert S.main(["--base", str(base), "--ops", "linear"]) == 2
    assert "--ops takes op:evaluations pairs" in capsys.readouterr().err
