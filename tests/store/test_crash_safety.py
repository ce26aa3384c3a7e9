"""Crash safety: processes SIGKILLed between the git write and the DB write (and the other gaps) leave a
workspace `doctor()` reports and `reconcile()` repairs without loss; two processes share a workspace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_support import report, toy_source

from tik_store import Workspace
from tik_store.gitrepo import PENDING_PREFIX

PROCS = Path(__file__).with_name("_procs.py")


def child(*args: object, expect_kill: bool = False, timeout: float = 120) -> dict | None:
    out = subprocess.run([sys.executable, str(PROCS), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout)
    if expect_kill:
        assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
        return None
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_kill_between_git_and_db_is_recorded_without_loss(ws, root):
    before = len(ws.implementations())
    child("kill_between_git_and_db", ws.path, root, expect_kill=True)
    assert len(ws.implementations()) == before, "no row was written"
    problems = ws.doctor(in_flight_s=0)
    assert len(problems) == 1 and "orphan commit" in problems[0], problems
    # a pending ref younger than the in-flight window belongs to a write in progress: not a problem yet
    assert ws.doctor() == [] and ws.reconcile() == []
    repairs = ws.reconcile(in_flight_s=0)
    assert any("recorded orphan commit" in r for r in repairs), repairs
    assert ws.doctor(in_flight_s=0) == []
    new = ws.implementations()[-1]
    full = ws.implementation(new["id"])
    assert (new["parents"], new["proposer"], new["rationale"], new["status"]) == (
        [root], "claude", "fuse the epilogue", "candidate")
    assert "TAG = 'crash'" in ws.source(new["id"])
    assert full["usage"]["input_tokens"] == 1234 and full["usage"]["cost_usd"] == pytest.approx(0.5)
    assert full["modification"]["expected_effect"] == "1.2x"
    assert ws.git.ref_target(f"refs/derivations/{new['id']}") == new["commit"]
    assert ws.git.refs(PENDING_PREFIX) == {}
    assert ws.reconcile(in_flight_s=0) == [], "reconcile is idempotent"


def test_open_finishes_an_interrupted_write(ws, root):
    child("kill_between_git_and_db", ws.path, root, expect_kill=True)
    before = len(ws.implementations())
    for ref in ws.git.refs(PENDING_PREFIX):
        old = time.time() - 120
        os.utime(ws.git.path / ref, (old, old))
    with Workspace.open(ws.path) as again:
        assert len(again.implementations()) == before + 1
        assert again.implementations()[-1]["rationale"] == "fuse the epilogue"
        assert again.git.refs(PENDING_PREFIX) == {}
        assert again.doctor(in_flight_s=0) == []


def test_kill_between_db_and_ref(ws, root):
    child("kill_between_db_and_ref", ws.path, root, expect_kill=True)
    new = ws.implementations()[-1]
    assert new["proposer"] == "tuner"
    problems = ws.doctor(in_flight_s=0)
    assert any(f"ref refs/derivations/{new['id']} is missing" in p for p in problems), problems
    assert any("interrupted write" in p for p in problems), problems
    ws.reconcile(in_flight_s=0)
    assert ws.doctor(in_flight_s=0) == []
    assert ws.git.ref_target(f"refs/derivations/{new['id']}") == new["commit"]


def test_kill_during_promotion_is_completed_from_the_tag(ws, root):
    impl = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="tuner")
    ws.record_evaluation(impl, report(eligible=True, objective=5.0))
    child("kill_during_promotion", ws.path, impl, expect_kill=True)
    assert ws.implementation(impl)["status"] == "eligible"
    problems = ws.doctor(in_flight_s=0)
    assert problems == [f"tag promoted/toy/{impl} exists but #{impl} is eligible (promotion unrecorded)"]
    ws.reconcile(in_flight_s=0)
    assert ws.implementation(impl)["status"] == "promoted"
    assert [(d["action"], d["by"], d["reason"]) for d in ws.decisions(impl)] == [("promote", "alice", "2x faster")]
    assert ws.incumbent("toy")["id"] == impl
    assert ws.doctor(in_flight_s=0) == []


def test_doctor_finds_and_reconcile_repairs(ws, root):
    a = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="tuner")
    b = ws.add_implementation("toy", toy_source(3), parents=[a], proposer="tuner")
    assert ws.doctor(in_flight_s=0) == []
    # a deleted derivation ref
    (ws.path / "repo" / "refs" / "derivations" / str(a)).unlink()
    # a lost promotion tag
    (ws.path / "repo" / "refs" / "tags" / "promoted" / "toy" / str(root)).unlink()
    # a status that disagrees with its last decision
    ws.record_evaluation(b, report(eligible=True))
    ws.decide(b, "reject", by="bob", reason="no")
    ws.set_status(b, "eligible", "planted")
    # a worker that died while running
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ws.set_worker_state(pid=dead.pid, state="running")
    problems = ws.doctor(in_flight_s=0)
    assert any(f"ref refs/derivations/{a} is missing" in p for p in problems)
    assert any(f"promoted but tag promoted/toy/{root} is missing" in p for p in problems)
    assert any(f"#{b}: status eligible but its last decision was reject" in p for p in problems)
    assert any("is recorded running but is gone" in p for p in problems)
    assert len(problems) == 4, problems
    repairs = ws.reconcile(in_flight_s=0)
    assert len(repairs) == 4, repairs
    assert ws.doctor(in_flight_s=0) == []
    assert ws.implementation(b)["status"] == "rejected"
    assert ws.worker_state()["state"] == "crashed"
    assert b not in [r["id"] for r in ws.promotion_queue()]


def test_doctor_reports_what_it_cannot_repair(ws, root):
    a = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="tuner")
    sha = ws.implementation(a)["commit"]
    (ws.path / "repo" / "objects" / sha[:2] / sha[2:]).unlink()
    (ws.path / "repo" / "refs" / "derivations" / "777").write_text(sha + "\n")
    problems = ws.doctor(in_flight_s=0)
    assert f"#{a}: commit {sha[:12]} is missing from the repository" in problems
    assert "ref refs/derivations/777 names no implementation in the database" in problems
    ws.reconcile(in_flight_s=0)
    assert len(ws.doctor(in_flight_s=0)) == 2


def test_two_writer_processes_lose_nothing(ws, root):
    procs = [subprocess.Popen([sys.executable, str(PROCS), "writer", str(ws.path), tag, "40", str(root)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tag in ("w1", "w2")]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-2000:]
        outs.append(json.loads(stdout)["ids"])
    ids = outs[0] + outs[1]
    assert len(set(ids)) == 80
    rows = {r["id"]: r for r in ws.implementations()}
    assert set(ids) <= set(rows)
    assert sorted(r["proposer"] for r in rows.values() if r["id"] in ids) == ["w1"] * 40 + ["w2"] * 40
    events = [e for e in ws.events_since(0, limit=10_000) if e["kind"] == "writer"]
    assert sorted((e["payload"]["tag"], e["payload"]["i"]) for e in events) == sorted(
        (t, i) for t in ("w1", "w2") for i in range(40))
    assert ws.doctor(in_flight_s=0) == []


def test_writer_and_reader_processes_share_a_workspace(ws, root):
    """A worker-like writer and a viewer-like reader run side by side (TIK_STORE_SOAK_S, default 30 s):
    the reader never sees a half-written derivation; nothing the writer recorded is lost."""
    seconds = float(os.environ.get("TIK_STORE_SOAK_S", "30"))
    start = time.time()
    w = subprocess.Popen([sys.executable, str(PROCS), "soak_writer", str(ws.path), str(seconds), str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = subprocess.Popen([sys.executable, str(PROCS), "soak_reader", str(ws.path), str(seconds)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wout, werr = w.communicate(timeout=seconds + 300)
    rout, rerr = r.communicate(timeout=seconds + 300)
    assert w.returncode == 0, werr[-2000:]
    assert r.returncode == 0, rerr[-2000:]
    written, seen = json.loads(wout)["ids"], json.loads(rout)
    assert time.time() - start >= seconds
    assert seen["bad"] == []
    assert seen["polls"] > 10 and seen["seen"] > 10, seen
    assert len(written) > 20
    rows = {x["id"] for x in ws.implementations()}
    assert set(written) <= rows
    assert ws.llm_usage_totals()["calls"] == len(written)
    assert ws.doctor(in_flight_s=0) == []
    with Workspace.open(ws.path) as again:
        assert {x["id"] for x in again.implementations()} == rows
