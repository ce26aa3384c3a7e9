"""Bad input to `tik`: each is a one-line error with a non-zero exit, and nothing in the workspace changes.

The table in docs/TROUBLESHOOTING.md lists each input with the line it gives; these tests hold it true.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import tik_store.workspace
from tik_store import Workspace
from tik_tui.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "tests" / "agent"
EVALUATOR = f"{AGENT / 'fixtures' / 'fake_eval.py'}:evaluate"
sys.path.insert(0, str(AGENT))
from agent_helpers import make_toy_workspace  # noqa: E402


@pytest.fixture
def toy(tmp_path):
    ws, root = make_toy_workspace(tmp_path / "ws")
    ws.close()
    return tmp_path / "ws"


def _snapshot(path: Path) -> tuple:
    with Workspace.open(path, readonly=True) as ws:
        rows = [(r["id"], r["status"]) for r in ws.implementations()]
        return rows, ws.worker_state()["state"], len(ws.events_since(0))


def _one_line_error(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and "usage:" not in err, err
    return err


def _tik(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's (one-line) errors
        return int(e.code)


BAD_OPTIONS = {
    "show-huge-id": (["show", "99999999999999999999999"], "no implementation has id 99999999999999999999999"),
    "approve-huge-id": (["approve", "99999999999999999999999"], "no implementation has id"),
    "reject-zero-id": (["reject", "0", "--reason", "x"], "no implementation has id 0"),
    "export-huge-id": (["export", "toy", "99999999999999999999999"], "no implementation has id"),
    "search-timeout-negative": (["search", "--timeout", "-5"], "--timeout must be positive, not -5"),
    "check-timeout-nan": (["check", "rmsnorm", "--timeout", "nan"], "--timeout must be a finite number, not 'nan'"),
    "search-budget-negative": (["search", "--budget", "-1"], "--budget must be at least 1, not -1"),
    "search-budget-zero": (["search", "--budget", "0"], "--budget must be at least 1, not 0"),
    "search-max-time-negative": (["search", "--max-time", "-1"], "--max-time must be positive"),
    "search-patience-zero": (["search", "--patience", "0"], "--patience must be at least 1, not 0"),
    "search-screen-negative": (["search", "--screen", "-1"], "--screen must be 0 or more, not -1"),
    "search-max-cost-inf": (["search", "--max-cost", "inf"], "--max-cost must be a finite number, not 'inf'"),
    "log-unknown-op": (["log", "--op", "nosuchop"], "no operator 'nosuchop' in this workspace (it has: toy)"),
}


@pytest.mark.parametrize("argv, message", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_option_is_one_line_and_changes_nothing(toy, capsys, argv, message):
    before = _snapshot(toy)
    err = _one_line_error(capsys, _tik(["-w", str(toy), *argv, "--evaluator", EVALUATOR]
                                       if argv[0] == "search" else ["-w", str(toy), *argv]))
    assert message in err
    assert _snapshot(toy) == before


def test_the_checks_are_not_a_blanket_refusal(toy, capsys):
    """The same options with good values run (a validator that refused everything would pass the test above)."""
    assert _tik(["-w", str(toy), "search", "--proposer", "tuner", "--budget", "1", "--timeout", "30", "--screen",
                 "0", "--patience", "1", "--max-time", "60", "--evaluator", EVALUATOR]) == 0
    assert _tik(["-w", str(toy), "log", "--op", "toy"]) == 0
    assert _tik(["-w", str(toy), "show", "#1"]) == 0


# ------------------------------------------------------------------------------ a damaged repository


def _drop_objects(path: Path) -> None:
    for d in (path / "repo" / "objects").iterdir():
        if len(d.name) == 2:
            shutil.rmtree(d)


@pytest.mark.parametrize("argv", [["show", "1"], ["show", "1", "--diff"], ["export", "toy", "--to", "OUT"],
                                  ["search", "--proposer", "tuner", "--budget", "1", "--evaluator", EVALUATOR]],
                         ids=["show", "show-diff", "export", "search"])
def test_missing_git_objects_are_one_line(toy, tmp_path, capsys, argv):
    _drop_objects(toy)
    before = _snapshot(toy)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    err = _one_line_error(capsys, _tik(["-w", str(toy), *argv]))
    assert "is missing from" in err and "tik doctor" in err
    assert _snapshot(toy) == before and not (tmp_path / "out" / "toy.py").exists()
    assert _tik(["-w", str(toy), "doctor"]) == 1
    assert "missing from the repository" in capsys.readouterr().out


# ------------------------------------------------------------------------------ read-only, full disk


def _viewer() -> list[str]:
    """A command prefix that runs without the right to write files this user does not own: for root, with its
    capabilities dropped (root ignores file modes otherwise)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot take away write access")
    return ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all"]


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)


def test_read_only_workspace_is_viewable_and_writes_say_why(toy):
    prefix = _viewer()
    _read_only(toy)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def tik(*argv):
        return subprocess.run([*prefix, sys.executable, "-m", "tik_tui.cli.main", "-w", str(toy), *argv],
                              capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)

    try:
        for argv in (["log"], ["show", "1"], ["status"], ["doctor"]):
            out = tik(*argv)
            assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)
        assert "the library's root" in tik("log").stdout
        for argv in (["approve", "1"], ["search", "--budget", "1"], ["doctor", "--repair"]):
            out = tik(*argv)
            assert out.returncode == 2, (argv, out.stderr)
            assert out.stderr.count("\n") == 1 and "is read-only for this user" in out.stderr, out.stderr
            assert "corrupt" not in out.stderr
    finally:
        for p in [toy, *toy.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)


def test_full_disk_on_open_says_so(toy, capsys, monkeypatch):
    real = sqlite3.connect

    def full(*a, **k):
        conn = real(*a, **k)
        conn.close()
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(tik_store.workspace.sqlite3, "connect", full)
    err = _one_line_error(capsys, _tik(["-w", str(toy), "status"]))
    assert "disk full" in err and "corrupt" not in err


def test_disk_filling_during_a_search_stops_the_worker_with_its_reason(toy, capsys, monkeypatch):
    """The second derivation's write finds the disk full: the search stops, its state says why (not `running`),
    the command prints one line, and the first derivation is kept."""
    real = Workspace.add_implementation
    calls = []

    def add(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, *a, **k)

    monkeypatch.setattr(Workspace, "add_implementation", add)
    err = _one_line_error(capsys, _tik(["-w", str(toy), "search", "--proposer", "tuner", "--budget", "5",
                                        "--screen", "0", "--json", "--evaluator", EVALUATOR]))
    assert "disk full" in err
    with Workspace.open(toy, readonly=True) as ws:
        st = ws.worker_state()
        assert st["state"] == "crashed" and st["message"].startswith("disk full"), st
        assert len(ws.implementations()) == 2
    assert not (toy / "worker.reserve").exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root to mount a tmpfs")
def test_a_really_full_disk_during_a_detached_worker(tmp_path):
    """On a 2 MB tmpfs with ~200 KB left once the worker holds its reserve: the worker's log ends in one line,
    and its state is `crashed: disk full` although the disk was full when it had to write that."""
    script = f"""
set -e
D={tmp_path}/mnt; mkdir -p $D; mount -t tmpfs -o size=2M tmpfs $D
{sys.executable} -c "import sys; sys.path.insert(0, '{AGENT}'); from agent_helpers import make_toy_workspace; \\
make_toy_workspace('$D/ws')[0].close()"
avail=$(df --output=avail -B1 $D | tail -1)
dd if=/dev/zero of=$D/filler bs=1024 count=$(( (avail - 1248576) / 1024 )) status=none
{sys.executable} -m tik_tui.worker -w $D/ws --evaluator {EVALUATOR} --proposer tuner --budget 400 --screen 0 \\
  > {tmp_path}/log 2>&1 || true
{sys.executable} -m tik_tui.cli.main -w $D/ws status --json > {tmp_path}/status.json
"""
    out = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    log = (tmp_path / "log").read_text()
    assert "Traceback" not in log and log.strip().splitlines()[-1].startswith("tik-worker: error: disk full"), log
    import json

    worker = json.loads((tmp_path / "status.json").read_text())["worker"]
    assert worker["state"] == "crashed" and worker["message"].startswith("disk full"), worker
