"""Executors: several evaluations in flight on a local pool or a Ray cluster, the same IR as one at
a time, and a killed evaluator process or Ray worker retried once, then failed, the search going on."""

import ast
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from agent_helpers import FIXTURES, make_toy_workspace

from tik_tui.cli.main import main
from tik_tui.worker import run_search

REPO = Path(__file__).resolve().parents[2]


def ir(path: Path, op: str) -> list[tuple]:
    """The derivations as the IR holds them, without what differs run to run (ids of searches, timings)."""
    from tik_store import Workspace

    with Workspace.open(path) as ws:
        out = []
        for r in ws.implementations(op=op):
            checks = sorted((c["name"], bool(c["passed"]), c.get("detail")) for c in ws.checks(r["id"]))
            out.append((r["id"], r["source_sha256"], r["parent"], r["status"], r["status_detail"], checks))
        return out


def evaluated(path: Path) -> list[dict]:
    from tik_store import Workspace

    with Workspace.open(path) as ws:
        return [e["payload"] for e in ws.events_since(0, 10000) if e["kind"] == "evaluated"]


def overlapping(events: list[dict]) -> bool:
    spans = sorted((e["worker"]["started"], e["worker"]["finished"]) for e in events)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rms_ws(tmp_path_factory):
    """A fresh workspace (all operators) to copy for each search on rmsnorm."""
    w = tmp_path_factory.mktemp("template") / "ws"
    assert main(["-w", str(w), "init", "--json"]) == 0
    return w


def _copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest


#: greedy tuner search on rmsnorm: its proposals do not depend on results in flight
RMS = dict(ops=["rmsnorm"], proposer="tuner", budget=2, device="cpu", timeout=300, explore=False)


@pytest.fixture(scope="module")
def sequential_ir(rms_ws, tmp_path_factory):
    w = _copy(rms_ws, tmp_path_factory.mktemp("seq") / "ws")
    s = run_search(w, **RMS)
    assert s["state"] == "finished" and s["spent"] == 2, s
    events = evaluated(w)
    assert len(events) == 2 and not overlapping(events)
    return ir(w, "rmsnorm")


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray cluster of 2 CPUs on this machine, started (and stopped) by the test; its address."""
    ray = pytest.importorskip("ray")
    ctx = ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    # so a test's evaluate hook travels by value to Ray workers (they cannot import this module)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


# ----------------------------------------------------------------------------- same IR


def test_local_pool_keeps_two_in_flight_and_gives_the_same_ir(rms_ws, sequential_ir, tmp_path):
    w = _copy(rms_ws, tmp_path / "ws")
    s = run_search(w, **RMS, workers=2)
    assert s["state"] == "finished" and s["spent"] == 2, s
    events = evaluated(w)
    assert {e["worker"]["executor"] for e in events} == {"local"}
    assert len({e["worker"]["pid"] for e in events}) == 2, "each evaluation should have had its own process"
    assert overlapping(events), "the two evaluations did not run at the same time"
    assert ir(w, "rmsnorm") == sequential_ir
    assert [r[3] for r in sequential_ir[-2:]] == ["verified", "verified"]


def test_ray_cluster_gives_the_same_ir_as_the_local_executor(rms_ws, sequential_ir, ray_cluster, tmp_path):
    w = _copy(rms_ws, tmp_path / "ws")
    # a separate driver process, as `tik search --executor ray --address ADDR` is run
    out = subprocess.run([sys.executable, "-m", "tik_tui.cli.main", "-w", str(w), "search", "--op", "rmsnorm",
                          "--proposer", "tuner", "--budget", "2", "--device", "cpu", "--timeout", "300", "--greedy",
                          "--executor", "ray", "--address", ray_cluster, "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["state"] == "finished" and summary["spent"] == 2
    events = evaluated(w)
    assert {e["worker"]["executor"] for e in events} == {"ray"}
    assert ir(w, "rmsnorm") == sequential_ir


# ----------------------------------------------------------------------------- lost workers


class DyingEval:
    """The toy operator's fake evaluator, in a process that dies: always for BLOCK=16 (os._exit), and on
    the first attempt for num_warps=2, where it waits to be SIGKILLed from outside (its pid in `pids/`)."""

    def __init__(self, work: Path):
        self.work = str(work)
        self.fake = str(FIXTURES / "fake_eval.py")

    def __call__(self, op, candidate_path, **kw):
        src = Path(candidate_path).read_text()
        cfg = next(ast.literal_eval(n.value) for n in ast.parse(src).body
                   if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "CONFIG")
        tries = Path(self.work) / ("tries-" + hashlib.sha256(src.encode()).hexdigest()[:12])
        n = len(tries.read_text()) if tries.exists() else 0
        tries.write_text("x" * (n + 1))
        if cfg["BLOCK"] == 16 or (cfg["num_warps"] == 2 and n == 0):
            # a killed process leaves its job's directory behind: tidy it first
            shutil.rmtree(Path(candidate_path).parent, ignore_errors=True)
        if cfg["BLOCK"] == 16:
            os._exit(3)
        if cfg["num_warps"] == 2 and n == 0:
            (Path(self.work) / "pids").mkdir(exist_ok=True)
            (Path(self.work) / "pids" / str(os.getpid())).write_text("")
            time.sleep(60)
        spec = importlib.util.spec_from_file_location("tik_test_fake_eval_remote", self.fake)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.evaluate(op, candidate_path, **kw)


def _mod(row: dict) -> dict:
    m = row["modification"]
    return json.loads(m) if isinstance(m, str) else m


def _killer(pids: Path, done: threading.Event, killed: list[int]) -> None:
    """SIGKILL whichever process announces itself in `pids/` (the evaluation it is running is lost)."""
    while not done.is_set():
        for p in pids.glob("*") if pids.exists() else ():
            pid = int(p.name)
            if pid not in killed:
                killed.append(pid)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_killed_worker_is_retried_once_then_failed(tmp_path, executor, request):
    if executor == "ray":
        request.getfixturevalue("ray_cluster")
    ws, _ = make_toy_workspace(tmp_path / "ws")
    work = tmp_path / "work"
    work.mkdir()
    done, killed = threading.Event(), []
    t = threading.Thread(target=_killer, args=(work / "pids", done, killed), daemon=True)
    t.start()
    try:
        # ray: the in-process connection the fixture made; local: two evaluator processes
        s = run_search(ws.path, proposer="tuner", budget=4, explore=False, device="cpu", evaluate=DyingEval(work),
                       executor=executor, workers=2)
    finally:
        done.set()
        t.join(5)
    assert s["state"] == "finished" and s["spent"] == 4, s
    assert len(killed) == 1
    rows = [ws.implementation(i) for i in s["derivations"]]
    by_change = {tuple(_mod(r)["changed"].items()): r for r in rows}
    dead = by_change[(("BLOCK", 16),)]
    assert dead["status"] == "failed" and "evaluation lost 2 times" in dead["status_detail"], dead["status_detail"]
    assert ("died: exit status 3" if executor == "local" else "Ray worker lost") in dead["status_detail"]
    assert by_change[(("num_warps", 2),)]["status"] in ("verified", "eligible")
    assert sum(r["status"] != "failed" for r in rows) == 3
    retries = [e["payload"] for e in ws.events_since(0, 10000) if e["kind"] == "eval_retry"]
    assert sorted(e["id"] for e in retries) == sorted([dead["id"], by_change[(("num_warps", 2),)]["id"]])
    sigkilled = next(e for e in retries if e["id"] == by_change[(("num_warps", 2),)]["id"])
    assert ("killed by SIGKILL" if executor == "local" else "WorkerCrashedError") in sigkilled["reason"], sigkilled
    assert not ws.implementations(op="toy", status="candidate")
    ws.close()


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("args,message", [
    (["--executor", "bogus"], "unknown executor 'bogus' (use local or ray)"),
    (["--executor", "ray", "--address", "127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
    (["--executor", "ray", "--address", "nonsense"], "bad Ray address 'nonsense'"),
    (["--executor", "ray"], "--executor ray needs --address ADDR"),
    (["--address", "127.0.0.1:6379"], "--address is only used with --executor ray"),
    (["--workers", "0"], "--workers must be at least 1"),
], ids=["unknown", "unreachable", "malformed", "no-address", "address-without-ray", "zero-workers"])
@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detach"])
def test_bad_executor_options_are_one_line_errors(tmp_path, capsys, monkeypatch, args, message, detach):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ws, _ = make_toy_workspace(tmp_path / "ws")
    ws.close()
    argv = ["-w", str(tmp_path / "ws"), "search", "--proposer", "tuner", *args] + (["--detach"] if detach else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tik: error: ") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "ws" / "worker.log").exists(), "nothing should have been started"


def test_missing_ray_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    from tik_tui import worker

    ws, _ = make_toy_workspace(tmp_path / "ws")
    ws.close()
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["-w", str(tmp_path / "ws"), "search", "--executor", "ray", "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tik: error: --executor ray needs the ray package: pip install 'tik[ray]' (or pip install ray)"
    # the worker's own command line (what --detach runs) says the same in one line
    assert worker.main(["-w", str(tmp_path / "ws"), "--executor", "ray", "--address", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.strip().startswith("tik-worker: error: --executor ray needs the ray package")


def test_a_slot_process_runs_a_screen_job():
    """A ScreenJob goes through a slot process like an evaluation (so screening works with several workers);
    a broken parent makes the real screen fail, and that failure comes back as the screen's result."""
    from tik_tui.agent.executor import LocalPool
    from tik_tui.agent.jobs import ScreenJob

    pool = LocalPool(1)
    try:
        out = pool.submit(ScreenJob(op="rmsnorm", parent_source="raise SystemExit(3)\n", sources=["X = 1\n"],
                                    rounds=1, device="cpu", timeout=60)).result(timeout=300)
    finally:
        pool.close()
    assert out.lost is None and out.error is None, (out.lost, out.error)
    assert "the parent" in out.screen["failure"] and out.worker["executor"] == "local"


def test_cpu_slots_compute_the_roots_probes_once_and_remove_what_they_shared():
    """Two CPU slots of one pool evaluating at once: one of them runs the root's probes, the other reads them
    (`core.ROOT_SHARE`), and the directory goes with the pool."""
    from tik_kernels.contracts import get_contract
    from tik_tui.agent.executor import LocalPool
    from tik_tui.agent.jobs import EvalJob

    root = get_contract("rmsnorm").root_path.read_text()
    pool = LocalPool(2, device="cpu")
    share = pool.root_share
    try:
        assert share is not None and share.is_dir()
        futs = [pool.submit(EvalJob(op="rmsnorm", impl_id=k, source=root + f"\n# candidate {k}\n", root_id=0,
                                    root_source=root, device="cpu", timeout=120)) for k in (1, 2)]
        outs = [f.result(timeout=600) for f in futs]
    finally:
        pool.close()
    assert all(o.report and o.report["verified"] for o in outs), [(o.error, o.lost) for o in outs]
    assert sorted(o.worker["slot"] for o in outs) == [0, 1]
    assert sorted(o.report["phases"].get("probes_root_shared", 0.0) for o in outs) == [0.0, 1.0]
    assert not share.exists()


def test_more_workers_than_gpus_share_them_round_robin(monkeypatch):
    """`--workers N` beyond the visible GPUs: N evaluator processes pinned round-robin (the device lock makes their
    timings take turns on a shared GPU, tests/evaluator/test_devlock.py), where it used to be refused."""
    import torch

    from tik_tui.agent import executor as ex

    assert ex.gpu_pins(["0", "1"], 2) == ["0", "1"]
    assert ex.gpu_pins(["0", "1"], 5) == ["0", "1", "0", "1", "0"]
    made = {}

    class Pool:
        def __init__(self, n, *, evaluate=None, pins=None, device=None):
            made.update(n=n, pins=pins, device=device)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ex, "visible_gpus", lambda: ["3"])
    monkeypatch.setattr(ex, "LocalPool", Pool)
    ex.make_executor("local", workers=2, device="cuda")
    assert made == {"n": 2, "pins": ["3", "3"], "device": "cuda"}
