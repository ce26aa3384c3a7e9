"""The loop end to end on the real rmsnorm operator, through the real evaluator in the interpreter."""

import json

import pytest
from agent_helpers import FIXTURES

from tik_tui.cli.main import main
from tik_tui.worker import run_search


@pytest.mark.slow
def test_replay_search_on_rmsnorm_with_the_real_evaluator(tmp_path, capsys):
    from store import Workspace

    w = tmp_path / "ws"
    assert main(["-w", str(w), "init"]) == 0
    capsys.readouterr()
    s = run_search(w, ops=["rmsnorm"], proposer=f"replay:{FIXTURES / 'rmsnorm_replay.jsonl'}", budget=5,
                   device="cpu", timeout=300)
    assert s["state"] == "finished" and s["spent"] == 2, s
    with Workspace.open(w) as ws:
        good, bad = (ws.implementation(i) for i in s["derivations"])
        assert good["status"] == "verified", good["failure"]
        assert all(c["passed"] for c in ws.checks(good["id"])) and len(ws.checks(good["id"])) >= 5
        assert bad["status"] == "failed"
        failed = [c["name"] for c in ws.checks(bad["id"]) if not c["passed"]]
        assert failed and all("accuracy" in n or "gradient" in n for n in failed), failed
        # a person promotes the verified one; export writes it out
        ws.decide(good["id"], "promote", by="alice", reason="verified on cpu")
        assert ws.incumbent("rmsnorm")["id"] == good["id"]
        source = ws.source(good["id"])
    assert "CONFIG = {'TILE_ELEMS': 2048, 'MAX_WARPS': 8, 'BWD_ROWS': 128}" in source
    assert main(["-w", str(w), "export", "rmsnorm", "--to", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "rmsnorm.py").read_text() == source
    capsys.readouterr()
    assert main(["-w", str(w), "log", "--op", "rmsnorm", "--json"]) == 0
    log = {r["id"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert log[good["id"]] == "promoted" and log[bad["id"]] == "failed"
