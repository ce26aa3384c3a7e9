"""`tik ops`, `tik check`, `tik bench` as a user runs them (subprocesses, started concurrently):
exit codes, one-line errors without tracebacks, and --json output that is one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

ZEROS_RMSNORM = "import torch\n\n\ndef rmsnorm(x, w, eps=1e-6):\n    return torch.zeros_like(x)\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "zeros.py").write_text(ZEROS_RMSNORM)
    cmds = {
        "ops": ["ops", "--json"],
        "unknown": ["check", "no_such_op", "--json"],
        "root": ["check", "rmsnorm", "--json"],
        "zeros": ["check", "rmsnorm", "--impl", str(tmp / "zeros.py"), "--json"],
        "bench": ["bench", "rmsnorm", "--json"],
    }
    procs = {k: subprocess.Popen([sys.executable, "-m", "tik_tui.cli.main", *v], cwd=tmp, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, v in cmds.items()}
    out = {}
    for k, p in procs.items():
        stdout, stderr = p.communicate(timeout=400)
        out[k] = (p.returncode, stdout, stderr)
    return out


def test_ops_json_lists_contracts_and_cells(runs):
    rc, stdout, _ = runs["ops"]
    assert rc == 0
    docs = json.loads(stdout)
    ops = {d["op"]: d for d in docs}
    assert "rmsnorm" in ops
    r = ops["rmsnorm"]
    assert r["entries"] == ["rmsnorm"] and r["cells"]["gpu"] and r["cells"]["cpu"]
    assert {"name", "params", "coeff", "limit"} <= set(r["cells"]["gpu"][0])


def test_unknown_operator_exits_2_with_one_line(runs):
    rc, stdout, stderr = runs["unknown"]
    assert rc == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("tik: error: unknown operator 'no_such_op'"), stderr


@pytest.mark.parametrize("argv,words", [
    (["check", "rmsnorm", "--impl", "{tmp}/missing.py", "--json"], "no such implementation file"),
    (["check", "rmsnorm", "--impl", "{tmp}/syntax.py"], "syntax error: expected ':' (line 1)"),
    (["check", "rmsnorm", "--impl", "{tmp}/binary.py"], "not a Python source file"),
    (["bench", "rmsnorm", "--impl", "{tmp}", "--json"], "is not a file"),
    (["check", "rmsnorm", "--timeout", "0"], "--timeout must be positive"),
    (["bench", "no_such_op"], "unknown operator"),
    (["check", "rmsnorm", "--device", "cuda"], "no CUDA GPU"),
])
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, argv, words):
    """The same entry point in-process (cheaper than a subprocess per case)."""
    from tik_tui.cli.main import main

    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "syntax.py").write_text("def rmsnorm(x, w, eps)\n")
    (tmp_path / "binary.py").write_bytes(bytes(range(256)))
    rc = main([a.format(tmp=tmp_path) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tik: error: ") and words in err, err


def test_check_of_the_library_root_is_verified(runs):
    rc, stdout, _ = runs["root"]
    doc = json.loads(stdout)
    assert rc == 0 and doc["verified"] is True and doc["failure"] is None and doc["op"] == "rmsnorm"
    assert len(doc["checks"]) > 20 and all(c["passed"] for c in doc["checks"])
    assert {"name", "requirement", "passed", "detail", "max_diff"} == set(doc["checks"][0])


def test_check_of_a_wrong_file_exits_1(runs):
    rc, stdout, _ = runs["zeros"]
    doc = json.loads(stdout)
    assert rc == 1 and doc["verified"] is False and "accuracy" in doc["failure"]


def test_bench_on_cpu_is_marked_interpreter(runs):
    rc, stdout, stderr = runs["bench"]
    doc = json.loads(stdout)
    assert rc == 0 and doc["verified"] is True
    assert doc["timing"] == "interpreter" and "not GPU timings" in doc["note"]
    assert "interpreter" in stderr.lower()
    assert doc["cells"] and all(c["median_us"] > 0 and c["baseline_median_us"] > 0 for c in doc["cells"])


@pytest.mark.parametrize("preset,expect", [(None, "0"), ("2", "2")])
def test_bench_starts_no_spare_child_unless_asked(monkeypatch, preset, expect):
    """`tik bench` is one evaluation: a pre-started child for a next candidate would be thrown away."""
    import tik_kernels.evaluator as ev
    from tik_tui.cli.main import main

    # set first, so that monkeypatch restores the variable (and drops the one `tik bench` sets) after the test
    monkeypatch.setenv("TIK_PRESTART", preset or "")
    if preset is None:
        monkeypatch.delenv("TIK_PRESTART")
    seen = []

    class Stop(Exception):
        pass

    def fake_evaluate(*a, **kw):
        import os

        seen.append(os.environ.get("TIK_PRESTART"))
        raise Stop("recorded")

    monkeypatch.setattr(ev, "evaluate", fake_evaluate)
    try:
        main(["bench", "rmsnorm", "--device", "cpu", "--json"])
    except (Stop, SystemExit):
        pass
    assert seen == [expect]
