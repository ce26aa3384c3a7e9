"""The search loop on a toy operator with an instant fake evaluator: recording, decisions, control, ablations."""

import threading
import time

import git
import pytest
from agent_helpers import FIXTURES, TOY_SOURCE

from tik_tui.agent import make_proposer
from tik_tui.agent.base import Proposal
from tik_tui.agent.loop import Search, SearchConfig
from tik_tui.agent.select import select_parent
from tik_tui.worker import WorkerBusy, WorkspaceLock, run_search

REPLAY = f"replay:{FIXTURES / 'toy_replay.jsonl'}"


def _refs(ws):
    repo = git.Repo(ws.path / "repo")
    return {r.path for r in repo.refs}


def test_replay_search_end_to_end(toy_ws, evaluate):
    ws = toy_ws
    root = ws.root("toy")["id"]
    summary = run_search(ws.path, proposer=REPLAY, budget=20, evaluate=evaluate)
    assert summary["state"] == "finished" and "used up" in summary["stop_reason"]
    ids = summary["derivations"]
    assert len(ids) == 6 and summary["spent"] == 6
    rows = {i: ws.implementation(i) for i in ids}
    bigger, bad_proposal, broken, warps, merge, best = (rows[i] for i in ids)
    # every derivation, failed ones too, is a git commit under refs/derivations/<id>
    refs = _refs(ws)
    for i in ids:
        assert f"refs/derivations/{i}" in refs
    assert bigger["status"] == "eligible" and bigger["parents"] == [root]
    assert bad_proposal["status"] == "failed" and "no 'source'" in bad_proposal["status_detail"]
    assert broken["status"] == "failed" and "batch_invariance" in (broken["failure"] or "")
    assert [c["name"] for c in ws.checks(broken["id"]) if not c["passed"]] == ["batch_invariance"]
    assert warps["status"] == "eligible"
    # the merge has two verified parents, in order
    assert merge["parents"] == [bigger["id"], warps["id"]]
    assert merge["modification"]["kind"] == "merge"
    # the recorded Messages API response: its usage and cost are in the IR
    assert best["parents"] == [merge["id"]]
    assert best["usage"]["input_tokens"] == 1200 and best["usage"]["cache_read_tokens"] == 5000
    assert best["usage"]["cost_usd"] == pytest.approx((1200 * 3 + 800 * 15 + 5000 * 0.3) / 1e6)
    assert summary["tokens"] == 1200 + 800 + 5000
    # nothing was promoted without a person; eligible ones wait in the queue
    queue = [r["id"] for r in ws.promotion_queue()]
    assert bigger["id"] in queue and warps["id"] in queue and not ws.decisions(bigger["id"])
    assert ws.incumbent("toy")["id"] == root
    # a person approves one and rejects another; the IR says who
    ws.decide(bigger["id"], "promote", by="alice", reason="looks good")
    ws.decide(warps["id"], "reject", by="bob", reason="num_warps=2 starves large H")
    assert ws.incumbent("toy")["id"] == bigger["id"]
    assert ws.implementation(warps["id"])["status"] == "rejected"
    assert [(d["action"], d["by"]) for d in ws.decisions(bigger["id"])] == [("promote", "alice")]
    assert f"refs/tags/promoted/toy/{bigger['id']}" in refs | _refs(ws)
    kinds = [e["kind"] for e in ws.events_since(0, 10000)]
    for k in ("search_started", "selected", "proposed", "evaluated", "proposal_failed", "queued", "search_finished"):
        assert k in kinds, k


def test_auto_promote_and_budget(toy_ws, evaluate):
    summary = run_search(toy_ws.path, proposer="tuner", budget=5, auto_promote=True, evaluate=evaluate)
    assert summary["spent"] == 5 and summary["stop_reason"].startswith("budget")
    promoted = [r for r in toy_ws.implementations(op="toy", status="promoted") if r["parents"]]
    assert promoted, "an eligible tuner step was not promoted"
    for r in promoted:
        assert [d["by"] for d in toy_ws.decisions(r["id"])] == ["auto-promote"]
    st = toy_ws.worker_state()
    assert st["state"] == "finished" and st["spent"] == 5


def test_sources_are_distinct_and_nothing_is_duplicated(toy_ws, evaluate):
    run_search(toy_ws.path, proposer="tuner", budget=12, evaluate=evaluate)
    rows = toy_ws.implementations(op="toy")
    shas = [r["source_sha256"] for r in rows]
    assert len(shas) == len(set(shas)) == 13


def test_branches_are_explored_and_greedy_ablation_is_not(tmp_path, evaluate):
    from agent_helpers import make_toy_workspace

    ws, root = make_toy_workspace(tmp_path / "explore")
    run_search(ws.path, proposer="tuner", budget=8, evaluate=evaluate)
    parents = {r["parents"][0] for r in ws.implementations(op="toy") if r["parents"]}
    assert parents - {root}, "only the root was ever expanded"
    ws2, root2 = make_toy_workspace(tmp_path / "greedy")
    run_search(ws2.path, proposer="tuner", budget=8, evaluate=evaluate, explore=False)
    parents2 = {r["parents"][0] for r in ws2.implementations(op="toy") if r["parents"]}
    assert parents2 == {root2}, "greedy mode expanded something other than the incumbent"
    ws.close()
    ws2.close()


class Spy:
    """A proposer that remembers what evidence it was shown, delegating to the tuner."""

    name = "spy"

    def __init__(self):
        self.inner = make_proposer("tuner")
        self.seen = []

    def propose(self, ctx):
        self.seen.append((ctx.parent["id"], len(ctx.attempts), len(ctx.opportunities)))
        p = self.inner.propose(ctx)
        if len(self.seen) == 2:
            return Proposal(source=p.source.replace("return x\n", "return x  # BROKEN\n"), rationale="bad")
        return p


@pytest.mark.parametrize("evidence", [True, False], ids=["evidence", "no-evidence"])
def test_evidence_ablation(toy_ws, evaluate, evidence):
    toy_ws.add_opportunity("toy", "bigger tiles", workloads=("large",), evidence="large cell is 10x small")
    spy = Spy()
    cfg = SearchConfig(ops=["toy"], budget=4, evidence=evidence, explore=False)
    Search(toy_ws, spy, cfg, evaluate=evaluate).run()
    attempts = [a for _, a, _ in spy.seen]
    opps = [o for _, _, o in spy.seen]
    if evidence:
        assert attempts == [0, 1, 2, 3] and set(opps) == {1}
    else:
        assert attempts == [0, 0, 0, 0] and set(opps) == {0}


def test_patience_stops_the_search(toy_ws, evaluate):
    class Worse:
        name = "worse"

        def __init__(self):
            self.n = 0

        def propose(self, ctx):
            self.n += 1
            return Proposal(source=TOY_SOURCE.replace('"BLOCK": 32', '"BLOCK": 16') + f"\n# variant {self.n}\n",
                            rationale="slower")

    s = Search(toy_ws, Worse(), SearchConfig(ops=["toy"], budget=50, patience=3), evaluate=evaluate).run()
    assert s["spent"] == 3 and s["stop_reason"].startswith("patience")


def test_evaluator_crash_fails_the_candidate_not_the_search(toy_ws):
    calls = []

    def flaky(op, path, **kw):
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        from agent_helpers import fake_eval

        return fake_eval.evaluate(op, path, **kw)

    s = run_search(toy_ws.path, proposer="tuner", budget=3, evaluate=flaky)
    first = toy_ws.implementation(s["derivations"][0])
    assert first["status"] == "failed" and "illegal memory access" in first["status_detail"]
    assert s["spent"] == 3 and len(calls) == 3


def test_pause_resume_stop_commands(toy_ws):
    from agent_helpers import fake_eval

    from tik_store import Workspace

    def slow(op, path, **kw):
        time.sleep(0.05)
        return fake_eval.evaluate(op, path, **kw)

    toy_ws.send_command("pause")
    out = {}
    t = threading.Thread(target=lambda: out.update(run_search(toy_ws.path, proposer="tuner", budget=14,
                                                              evaluate=slow)))
    t.start()
    with Workspace.open(toy_ws.path) as ws:
        def wait(pred, timeout=10.0):
            end = time.time() + timeout
            while time.time() < end:
                if pred():
                    return True
                time.sleep(0.05)
            return False

        assert wait(lambda: ws.worker_state()["state"] == "paused")
        time.sleep(0.4)
        assert len(ws.implementations(op="toy")) == 1, "a paused worker made a derivation"
        ws.send_command("resume")
        assert wait(lambda: len(ws.implementations(op="toy")) >= 3)
        ws.send_command("stop")
        t.join(10)
    assert not t.is_alive()
    assert out["state"] == "stopped" and out["stop_reason"] == "stop command"
    assert 2 <= out["spent"] < 14
    st = toy_ws.worker_state()
    assert st["state"] == "stopped" and st["message"] == "stop command"
    kinds = [e["kind"] for e in toy_ws.events_since(0, 10000)]
    assert kinds.index("paused") < kinds.index("resumed")


def test_one_worker_per_workspace(toy_ws, evaluate):
    with WorkspaceLock(toy_ws.path):
        with pytest.raises(WorkerBusy, match="already running"):
            run_search(toy_ws.path, proposer="tuner", budget=1, evaluate=evaluate)


def test_resume_evaluates_the_left_candidate_and_keeps_the_budget(toy_ws, evaluate):
    """What a SIGKILL leaves behind (recorded, unevaluated, worker_state running) is picked up."""
    root = toy_ws.root("toy")["id"]
    src = TOY_SOURCE.replace('"BLOCK": 32', '"BLOCK": 64')
    left = toy_ws.add_implementation("toy", src, parents=[root], proposer="tuner", rationale="tune BLOCK 32→64",
                                     modification={"kind": "tune", "config": {"BLOCK": 64, "num_warps": 4,
                                                                              "SPLIT": 1}, "search": "s-killed"})
    toy_ws.set_worker_state(pid=999999, state="running", proposer="tuner", ops="toy", budget=3, spent=1,
                            search="s-killed",
                            started=time.time() - 5)
    s = run_search(toy_ws.path, proposer="tuner", budget=3, evaluate=evaluate)
    assert s["resumed"] and s["search"] == "s-killed"
    assert toy_ws.implementation(left)["status"] == "eligible"
    assert s["spent"] == 3 and len(s["derivations"]) == 3 and s["derivations"][0] == left
    assert not toy_ws.implementations(op="toy", status="candidate")


def test_selection_prefers_unexplored_and_fast_nodes(toy_ws, evaluate):
    root = toy_ws.root("toy")["id"]
    fast_src = TOY_SOURCE.replace('"BLOCK": 32', '"BLOCK": 64')
    fast = toy_ws.add_implementation("toy", fast_src, parents=[root], proposer="t")
    toy_ws.record_evaluation(fast, evaluate("toy", _write(toy_ws, fast), root_path=_write(toy_ws, root)).as_dict())
    assert select_parent(toy_ws, "toy").parent["id"] == fast
    # many failures from `fast` push selection back to the root
    for n in range(8):
        bad = toy_ws.add_implementation("toy", fast_src + f"# BROKEN {n}\n", parents=[fast], proposer="t")
        toy_ws.set_status(bad, "failed", detail="broken")
    assert select_parent(toy_ws, "toy").parent["id"] == root
    # greedy: always the incumbent
    assert select_parent(toy_ws, "toy", explore=False).parent["id"] == root


def _write(ws, impl_id):
    p = ws.path / f"impl_{impl_id}.py"
    p.write_text(ws.source(impl_id))
    return str(p)


def test_a_repeated_source_is_not_recorded_twice_and_still_ends(toy_ws, evaluate):
    class Parrot:
        name = "parrot"

        def propose(self, ctx):
            return Proposal(source=TOY_SOURCE.replace('"BLOCK": 32', '"BLOCK": 64'), rationale="same again")

    s = Search(toy_ws, Parrot(), SearchConfig(ops=["toy"], budget=4), evaluate=evaluate).run()
    assert s["spent"] == 4 and len(s["derivations"]) == 1
    assert len(toy_ws.implementations(op="toy")) == 2
    assert sum(1 for e in toy_ws.events_since(0, 10000) if e["kind"] == "duplicate") == 3
