"""Edit-based proposals and the draft-timing tool of the claude proposer, through the real SDK client against
recorded responses (`--record`'s JSONL format)."""

import difflib
import json
from pathlib import Path

import pytest
from agent_helpers import MockAPI, fake_eval, recorded

from tik_tui.agent.edits import EditError, apply_edits, changed_lines
from tik_tui.worker import run_search

LIBRARY = Path(__file__).resolve().parents[2] / "tik_kernels" / "ops"


def _workspace(path: Path, op: str):
    from tik_kernels.contracts import get_contract
    from tik_store import Workspace

    c = get_contract(op)
    ws = Workspace.init(path)
    ws.ensure_operator(op, c.summary, c.describe(), c.fingerprint())
    root = ws.add_implementation(op, (LIBRARY / f"{op}.py").read_text(), proposer="root", rationale="the root",
                                 status="verified")
    ws.decide(root, "promote", by="init", reason="root")
    return ws


def _search(ws, api, budget=1):
    opts = {"client": api.client(), "sleep": lambda s: None}
    return run_search(ws.path, proposer="claude", budget=budget, evaluate=fake_eval.evaluate, proposer_opts=opts)


def test_edit_proposal_on_attention_changes_only_the_edited_lines(tmp_path):
    ws = _workspace(tmp_path / "ws", "attention")
    try:
        api = MockAPI(recorded("claude_attention_edit"))
        s = _search(ws, api)
        assert s["spent"] == 1 and s["state"] == "finished"
        impl = ws.implementation(s["derivations"][0])
        parent = ws.source(ws.root("attention")["id"])
        child = ws.source(impl["id"])
        # the candidate is a complete file and a git commit, the parent with exactly the edit applied
        good = recorded("claude_attention_edit")[1]["body"]["content"][0]["input"]["edits"][0]
        assert child == parent.replace(good["old"], good["new"]) and impl["commit"]
        diff = [ln for ln in difflib.unified_diff(parent.splitlines(), child.splitlines(), lineterm="", n=0)
                if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        assert len(diff) == 4 and changed_lines(parent, child) == (2, 2)
        mod = impl["modification"]
        assert mod["kind"] == "edit" and mod["edits"] == 1 and mod["edit_lines"] == "+2 -2"
        assert mod["model"] == "claude-sonnet-5-5"
        # both calls' output tokens are on the derivation: the failed edit cost something too
        assert impl["usage"]["output_tokens"] == 140 + 210
        # the edit that did not match went back to the model as an error, and the turn went on
        assert len(api.requests) == 2
        err = api.requests[1]["messages"][-1]["content"][0]
        assert err["tool_use_id"] == "toolu_a1" and err["is_error"] is True
        assert "edit 1: old text not found" in json.loads(err["content"])["error"]
        assert "closest line" in json.loads(err["content"])["error"]
    finally:
        ws.close()


def test_apply_edits_needs_exactly_one_match():
    src = "a = 1\nb = 1\nc = 2\n"
    assert apply_edits(src, [{"old": "c = 2", "new": "c = 3"}, {"old": "c = 3\n", "new": "c = 4\n"}]) == \
        "a = 1\nb = 1\nc = 4\n"
    with pytest.raises(EditError, match=r"edit 1: old text occurs 2 times \(lines 1, 2\)"):
        apply_edits(src, [{"old": " = 1", "new": " = 5"}])
    with pytest.raises(EditError, match="edit 2: old text not found"):
        apply_edits(src, [{"old": "a = 1", "new": "a = 0"}, {"old": "a = 1", "new": "a = 2"}])
    with pytest.raises(EditError, match="non-empty list"):
        apply_edits(src, [])
    with pytest.raises(EditError, match="old is empty"):
        apply_edits(src, [{"old": "", "new": "x"}])


def test_draft_timing_tool_on_the_cpu_interpreter(tmp_path):
    ws = _workspace(tmp_path / "ws", "rmsnorm")
    try:
        api = MockAPI(recorded("claude_draft_timing"))
        s = _search(ws, api)
        assert s["spent"] == 1
        results = {r["tool_use_id"]: r for r in api.requests[1]["messages"][-1]["content"]}
        # the draft was timed beside its parent in the sandboxed screen, on the one cell asked for
        good = json.loads(results["toolu_d1"]["content"])
        assert results["toolu_d1"]["is_error"] is False, good
        assert good["cells"] == ["cpu/hidden[T=16,H=64]"] and good["speedup_vs_parent"] > 0
        assert list(good["per_cell_speedup"]) == ["cpu/hidden[T=16,H=64]"] and "interpreter" in good["note"]
        # a draft that raises comes back with its error, as an error
        bad = json.loads(results["toolu_d2"]["content"])
        assert results["toolu_d2"]["is_error"] is True and "draft broke" in bad["error"]
        # on the CPU the first turn says what is not available instead of inventing numbers
        assert "not available on the CPU interpreter" in api.requests[0]["messages"][0]["content"]
    finally:
        ws.close()


class _GPUEvidence:
    """A DeviceEvidence stand-in on a GPU: remembers what was asked."""

    cuda = True

    def __init__(self):
        self.asked = []

    def compile_stats(self, impl_id):
        self.asked.append(impl_id)
        return {"kernels": [{"kernel": f"_k{impl_id}", "registers": 255, "spills": 12}]}

    def floors(self, impl_id):
        return {"gpu": "NVIDIA H200", "cells": [{"cell": "c", "floor_fraction": 0.41}]}


def test_first_turn_carries_the_parents_and_a_failed_candidates_compile_stats(toy_ws):
    from agent_helpers import _ctx_for

    from tik_tui.agent import make_proposer

    ctx = _ctx_for(toy_ws)
    ctx.device_evidence = ev = _GPUEvidence()
    ctx.attempts = [{"id": 7, "status": "failed", "failure": "timed out"}, {"id": 8, "status": "verified"},
                    {"id": 9, "status": "failed", "failure": None}]
    text = make_proposer("claude", client=object()).first_turn(ctx)
    assert ev.asked == [ctx.parent["id"], 7]
    assert '"spills": 12' in text and '"floor_fraction": 0.41' in text and "failed candidate #7" in text


def test_no_gpu_child_while_evaluations_share_the_gpu(toy_ws):
    from tik_tui.agent.evidence import DeviceEvidence

    ev = DeviceEvidence(toy_ws, "rmsnorm", "cuda", exclusive=False)
    for out in (ev.compile_stats(1), ev.time_draft("", ""), ev.profile(1, "c")):
        assert "share the GPU" in out["error"]
