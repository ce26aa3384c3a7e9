"""`tik init | log | show | status | approve | reject | doctor`: output, --json purity, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from store_support import report, toy_source

import tik_kernels.contracts
from tik_store import Workspace
from tik_tui.cli.main import main


@dataclass
class FakeContract:
    op: str
    root_path: Path
    summary: str = "a fake operator"
    impl: str = "fake"

    def describe(self) -> dict:
        return {"op": self.op}

    def fingerprint(self) -> str:
        return "fp-" + self.op


@pytest.fixture
def fake_ops(tmp_path, monkeypatch):
    files = {}
    for op in ("alpha", "beta"):
        files[op] = tmp_path / f"{op}.py"
        files[op].write_text(f"def {op}(x):\n    return x\n")
    fakes = {op: FakeContract(op, p) for op, p in files.items()}
    monkeypatch.setattr(tik_kernels.contracts, "all_contracts", lambda: fakes)
    return files


def tik(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def wsdir(tmp_path, fake_ops, capsys):
    d = tmp_path / "ws"
    code, out, err = tik(capsys, "init", "-w", str(d))
    assert code == 0, err
    return d


def test_init_seeds_a_promoted_root_per_operator(wsdir, fake_ops, capsys):
    code, out, err = tik(capsys, "init", "-w", str(wsdir))
    assert code == 2 and err == f"tik: error: {wsdir} is already a TIK workspace\n" and out == ""
    with Workspace.open(wsdir) as ws:
        for op, path in fake_ops.items():
            inc = ws.incumbent(op)
            assert inc["status"] == "promoted" and inc["proposer"] == "root" and inc["parents"] == []
            assert ws.source(inc["id"]) == path.read_text()
            assert [(d["action"], d["by"]) for d in ws.decisions(inc["id"])] == [("promote", "library")]
        assert ws.doctor(in_flight_s=0) == []


def test_init_with_no_operators_yet(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tik_kernels.contracts, "all_contracts", lambda: {})
    code, out, err = tik(capsys, "init", "-w", str(tmp_path / "w"), "--json")
    assert code == 0 and json.loads(out) == {"workspace": str(tmp_path / "w"), "operators": []}


def test_init_seeds_the_real_library(tmp_path, capsys):
    code, out, err = tik(capsys, "-w", str(tmp_path / "w"), "init", "--json")
    assert code == 0, err
    seeded = json.loads(out)["operators"]
    contracts = tik_kernels.contracts.all_contracts()
    assert [s["op"] for s in seeded] == [op for op, c in contracts.items() if c.root_path.exists()]
    with Workspace.open(tmp_path / "w") as ws:
        for s in seeded:
            assert ws.source(s["root"]) == Path(s["file"]).read_text()


def test_log_show_status_json_are_pure(wsdir, capsys):
    with Workspace.open(wsdir) as ws:
        root = ws.incumbent("alpha")["id"]
        child = ws.add_implementation("alpha", toy_source(2), parents=[root], proposer="tuner", rationale="BLOCK 2",
                                      usage={"model": "m", "input_tokens": 10, "output_tokens": 2, "cost_usd": 0.02})
        ws.record_evaluation(child, report(eligible=True, objective=7.5))
    code, out, err = tik(capsys, "log", "--json", "-w", str(wsdir))
    rows = json.loads(out)
    assert code == 0 and err == ""
    assert [(r["id"], r["op"], r["parent"], r["status"]) for r in rows] == [
        (1, "alpha", None, "promoted"), (2, "beta", None, "promoted"), (child, "alpha", root, "eligible")]
    assert {"id", "op", "parent", "parents", "status", "proposer", "rationale", "created", "objective"} <= set(rows[0])
    code, out, _ = tik(capsys, "log", "--op", "beta", "--json", "-w", str(wsdir))
    assert [r["id"] for r in json.loads(out)] == [2]
    code, out, _ = tik(capsys, "log", "--status", "eligible", "--json", "-w", str(wsdir))
    assert [r["id"] for r in json.loads(out)] == [child]
    code, out, _ = tik(capsys, "show", str(child), "--json", "-w", str(wsdir))
    doc = json.loads(out)
    assert doc["source"] == toy_source(2) and doc["lineage"] == [root, child]
    assert doc["diff"].startswith(f"--- #{root}/alpha.py\n+++ #{child}/alpha.py\n")
    assert [c["name"] for c in doc["checks"]] == ["batch_invariance/T=3", "deterministic"]
    assert doc["measurements"][0]["median_us"] == 7.5 and doc["usage"]["cost_usd"] == pytest.approx(0.02)
    code, out, _ = tik(capsys, "status", "--json", "-w", str(wsdir))
    st = json.loads(out)
    assert st["incumbents"]["alpha"]["id"] == root and [q["id"] for q in st["queue"]] == [child]
    assert st["worker"]["state"] == "idle" and st["usage"]["calls"] == 1
    # human output mentions what matters
    code, out, _ = tik(capsys, "show", str(child), "--diff", "-w", str(wsdir))
    assert "rationale:" in out and "BLOCK 2" in out and "+    return x * 2" in out and "PASS" in out
    code, out, _ = tik(capsys, "status", "-w", str(wsdir))
    assert f"#{child}" in out and "promotion queue" in out
    code, out, _ = tik(capsys, "log", "-w", str(wsdir))
    assert "eligible" in out and "BLOCK 2" in out


def test_json_on_stdout_only_in_a_real_process(wsdir):
    out = subprocess.run([sys.executable, "-m", "tik_tui.cli.main", "log", "--json", "-w", str(wsdir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == ""
    assert len(json.loads(out.stdout)) == 2


def test_approve_and_reject(wsdir, capsys):
    with Workspace.open(wsdir) as ws:
        root = ws.incumbent("alpha")["id"]
        good, other, plain = (ws.add_implementation("alpha", toy_source(i), parents=[root], proposer="tuner")
                              for i in (2, 3, 4))
        ws.record_evaluation(good, report(eligible=True, objective=5.0))
        ws.record_evaluation(other, report(eligible=True, objective=6.0))
        ws.record_evaluation(plain, report(eligible=False, objective=12.0))
    code, out, err = tik(capsys, "reject", str(plain), "--reason", "meh", "-w", str(wsdir))
    assert code == 2 and err == f"tik: error: #{plain} is not in the promotion queue (it is verified)\n"
    code, out, err = tik(capsys, "approve", str(good), "-w", str(wsdir))
    assert code == 0 and f"promoted #{good}" in out
    code, out, err = tik(capsys, "approve", str(good), "-w", str(wsdir))
    assert code == 2 and "not in the promotion queue (it is promoted, already decided)" in err
    code, out, err = tik(capsys, "reject", str(other), "--reason", "too risky", "--json", "-w", str(wsdir))
    assert code == 0 and json.loads(out)["status"] == "rejected"
    with Workspace.open(wsdir) as ws:
        assert ws.incumbent("alpha")["id"] == good
        assert ws.decisions(other)[0]["reason"] == "too risky"
    assert main(["reject", str(other), "-w", str(wsdir)]) == 2  # --reason is required
    assert capsys.readouterr().err.startswith("tik: error: the following arguments are required: --reason")


def test_errors_are_one_line(tmp_path, wsdir, capsys):
    missing = tmp_path / "nowhere"
    for argv in (["log"], ["show", "1"], ["status"], ["approve", "1"], ["doctor"]):
        code, out, err = tik(capsys, *argv, "-w", str(missing))
        assert (code, out) == (2, "")
        assert err == f"tik: error: no TIK workspace at {missing} (run `tik init`)\n"
    code, out, err = tik(capsys, "show", "999", "--json", "-w", str(wsdir))
    assert (code, out, err) == (2, "", "tik: error: no implementation #999 in this workspace\n")
    (wsdir / "tik.db").write_bytes(b"garbage" * 1000)
    for suffix in ("-wal", "-shm"):
        (wsdir / f"tik.db{suffix}").unlink(missing_ok=True)
    code, out, err = tik(capsys, "log", "-w", str(wsdir))
    assert code == 2 and err.startswith("tik: error: corrupt workspace database") and err.count("\n") == 1


def test_doctor_command(wsdir, capsys):
    code, out, err = tik(capsys, "doctor", "-w", str(wsdir))
    assert code == 0 and "healthy" in out
    (wsdir / "repo" / "refs" / "derivations" / "1").unlink()
    code, out, err = tik(capsys, "doctor", "--json", "-w", str(wsdir))
    doc = json.loads(out)
    assert code == 1 and doc["healthy"] is False and "refs/derivations/1 is missing" in doc["problems"][0]
    code, out, err = tik(capsys, "doctor", "--repair", "-w", str(wsdir))
    assert code == 0 and "repaired: #1: recreated refs/derivations/1" in out
    code, out, err = tik(capsys, "doctor", "-w", str(wsdir))
    assert code == 0
