"""The worker as a real process: SIGKILL mid-evaluation and resume; SIGTERM; --detach with pause/resume/stop."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_helpers import FIXTURES, make_toy_workspace

from tik_tui.cli.main import main

EVALUATOR = f"{FIXTURES / 'fake_eval.py'}:evaluate"
REPO = Path(__file__).resolve().parents[2]


def _worker(ws_path, *args, **env):
    return subprocess.Popen([sys.executable, "-m", "tik_tui.worker", "-w", str(ws_path), "--evaluator", EVALUATOR,
                             *args], env={**os.environ, **env}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait(pred, timeout=30.0, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _lines(p: Path) -> list[str]:
    return p.read_text().splitlines() if p.exists() else []


def test_sigkill_mid_evaluation_then_resume(tmp_path):
    ws, root = make_toy_workspace(tmp_path / "ws")
    mark = tmp_path / "evals"
    proc = _worker(ws.path, "--proposer", "tuner", "--budget", "4", TIK_FAKE_EVAL_MARK=str(mark),
                   TIK_FAKE_EVAL_SLEEP_AT="2:60")
    _wait(lambda: len(_lines(mark)) >= 2, what="the second evaluation")
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    left = ws.implementations(op="toy", status="candidate")
    assert len(left) == 1, "the killed evaluation's candidate should be recorded, unevaluated"
    killed = left[0]["id"]
    assert ws.worker_state()["state"] == "running"
    assert len(ws.implementations(op="toy")) == 3
    # restart: resumes the same search, evaluates the candidate first, spends only what is left
    proc = _worker(ws.path, "--proposer", "tuner", "--budget", "4", TIK_FAKE_EVAL_MARK=str(mark))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    rows = ws.implementations(op="toy")
    assert len(rows) == 1 + 4, [(r["id"], r["status"]) for r in rows]
    assert not [r for r in rows if r["status"] == "candidate"]
    assert len({r["source_sha256"] for r in rows}) == len(rows), "a config was proposed twice"
    assert ws.implementation(killed)["status"] in ("verified", "eligible")
    evals = _lines(mark)
    # the interrupted candidate is evaluated again, first
    assert len(evals) == 5 and Path(evals[1]).name == Path(evals[2]).name == f"toy_{killed}.py"
    kinds = [(e["kind"], e["impl_id"]) for e in ws.events_since(0, 10000)]
    assert ("search_resumed", None) in kinds and ("resume_evaluate", killed) in kinds
    st = ws.worker_state()
    assert st["state"] == "finished" and st["spent"] == 4
    assert sum(1 for k, _ in kinds if k == "search_started") == 2
    assert len({e["payload"]["search"] for e in ws.events_since(0, 10000) if e["kind"] == "search_started"}) == 1
    ws.close()


def test_sigterm_finishes_the_evaluation_in_flight_and_stops(tmp_path):
    ws, _ = make_toy_workspace(tmp_path / "ws")
    mark = tmp_path / "evals"
    proc = _worker(ws.path, "--proposer", "tuner", "--budget", "10", TIK_FAKE_EVAL_MARK=str(mark),
                   TIK_FAKE_EVAL_SLEEP="0.5")
    _wait(lambda: len(_lines(mark)) >= 1, what="the first evaluation")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    st = ws.worker_state()
    assert st["state"] == "stopped" and "SIGTERM" in st["message"]
    assert not ws.implementations(op="toy", status="candidate")
    assert 1 <= len(ws.implementations(op="toy")) - 1 < 10
    ws.close()


def test_detach_pause_resume_stop_through_the_cli(tmp_path, monkeypatch, capsys):
    ws, _ = make_toy_workspace(tmp_path / "ws")
    w = str(ws.path)
    assert main(["-w", w, "pause"]) == 2
    assert "no worker is running" in capsys.readouterr().err
    monkeypatch.setenv("TIK_FAKE_EVAL_SLEEP", "0.15")
    assert main(["-w", w, "search", "--proposer", "tuner", "--budget", "60", "--detach", "--evaluator",
                 EVALUATOR]) == 0
    assert "worker started" in capsys.readouterr().out
    _wait(lambda: len(ws.implementations(op="toy")) >= 2, what="the detached worker's first derivation")
    # one worker per workspace
    assert main(["-w", w, "search", "--proposer", "tuner", "--budget", "1", "--evaluator", EVALUATOR]) == 2
    assert "already running" in capsys.readouterr().err
    assert main(["-w", w, "pause"]) == 0
    _wait(lambda: ws.worker_state()["state"] == "paused", what="paused")
    n = len(ws.implementations(op="toy"))
    time.sleep(0.8)
    assert len(ws.implementations(op="toy")) == n, "a paused worker kept deriving"
    assert main(["-w", w, "resume"]) == 0
    _wait(lambda: len(ws.implementations(op="toy")) > n, what="progress after resume")
    assert main(["-w", w, "stop", "--wait", "30", "--json"]) == 0
    assert '"stopped": true' in capsys.readouterr().out
    st = ws.worker_state()
    assert st["state"] == "stopped" and st["message"] == "stop command"
    assert not ws.implementations(op="toy", status="candidate")
    assert (ws.path / "worker.log").exists()
    ws.close()


@pytest.mark.parametrize("bad", [["--proposer", "nonsense"], ["--op", "nope", "--proposer", "tuner"]],
                         ids=["proposer", "op"])
def test_search_user_errors_are_one_line(tmp_path, capsys, bad):
    ws, _ = make_toy_workspace(tmp_path / "ws")
    assert main(["-w", str(ws.path), "search", *bad, "--budget", "1", "--evaluator", EVALUATOR]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tik: error: ") and err.count("\n") == 1 and "Traceback" not in err
    ws.close()


def test_claude_without_key_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    ws, _ = make_toy_workspace(tmp_path / "ws")
    assert main(["-w", str(ws.path), "search", "--proposer", "claude", "--budget", "1"]) == 2
    assert "ANTHROPIC_API_KEY is not set" in capsys.readouterr().err
    ws.close()
