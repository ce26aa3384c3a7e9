"""The Workspace API: lineage in rows and in git, statuses, decisions, the tables around them."""

from __future__ import annotations

import os
import random
import sqlite3

import git
import pytest
from store_support import TOY, report, toy_source

from tik_store import STATUSES, Workspace, WorkspaceError
from tik_store.errors import UnknownImplementation


def test_derivation_is_a_git_commit_whose_parent_is_the_parent_commit(ws, root):
    child = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="tuner", rationale="BLOCK 2")
    merge = ws.add_implementation("toy", toy_source(3), parents=[child, root], proposer="claude", rationale="merge")
    repo = git.Repo(ws.path / "repo")
    try:
        c_root = repo.commit(f"refs/derivations/{root}")
        c_child = repo.commit(f"refs/derivations/{child}")
        c_merge = repo.commit(f"refs/derivations/{merge}")
        assert c_root.parents == ()
        assert [p.hexsha for p in c_child.parents] == [c_root.hexsha]
        assert [p.hexsha for p in c_merge.parents] == [c_child.hexsha, c_root.hexsha]
        assert c_merge.tree[ws.implementation(merge)["filename"]].data_stream.read().decode() == toy_source(3)
        assert c_child.hexsha == ws.implementation(child)["commit"]
        # no work tree, HEAD still unborn: nothing ever checks anything out
        assert repo.bare
        assert not repo.head.is_valid()
        assert (ws.path / "repo" / "HEAD").read_text().strip() == "ref: refs/heads/master"
        assert not (ws.path / "repo" / "index").exists()
        assert sorted(p.name for p in ws.path.iterdir()) == ["repo", "tik.db", "tik.db-shm", "tik.db-wal"]
    finally:
        repo.close()
    assert ws.implementation(merge)["parents"] == [child, root]
    assert ws.implementation(merge)["parent"] == child
    assert [r["id"] for r in ws.lineage(merge)] == [root, child, merge]
    assert [r["id"] for r in ws.children(root)] == [child, merge]
    assert ws.source(child) == toy_source(2)


def test_modification_is_computed_against_the_parent(ws, root):
    new = TOY.replace("return x", "return x + 0") + "\n\ndef helper():\n    return 1\n"
    impl = ws.add_implementation("toy", new, parents=[root], proposer="claude",
                                 modification={"expected_effect": "1.1x at T=1", "numerical_risks": ["none"],
                                               "mechanism": "fusion"})
    m = ws.implementation(impl)["modification"]
    assert (m["lines_added"], m["lines_removed"]) == (5, 1)  # 1 edited, 2 blank + 2 new lines
    assert m["functions_changed"] == ["toy", "helper"]
    assert m["expected_effect"] == "1.1x at T=1" and m["numerical_risks"] == ["none"]
    assert m["mechanism"] == "fusion"
    diff = ws.diff(impl)
    assert "-    return x\n" in diff and "+    return x + 0\n" in diff and "+def helper():\n" in diff


def test_record_evaluation_sets_status_and_keeps_history(ws, root):
    a = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="tuner")
    b = ws.add_implementation("toy", toy_source(3), parents=[root], proposer="tuner")
    c = ws.add_implementation("toy", toy_source(4), parents=[root], proposer="tuner")
    assert ws.record_evaluation(a, report(verified=False)) == "failed"
    assert ws.record_evaluation(b, report(verified=True, eligible=False, objective=11.5)) == "verified"
    assert ws.record_evaluation(c, report(verified=True, eligible=True, objective=9.0)) == "eligible"
    assert ws.implementation(a)["failure"] == "batch_invariance/T=3"
    failed = {x["id"]: x["failed_checks"] for x in ws.attempts("toy", parent=root)}
    assert failed == {a: ["batch_invariance/T=3"], b: [], c: []}
    m = ws.measurements(c)
    assert m[0]["median_us"] == 9.0 and m[0]["gpu"] == "NVIDIA H200" and m[0]["env"]["torch"] == "2.11.0"
    # a re-evaluation adds a batch; the latest is what checks() shows, history keeps both
    ws.record_evaluation(b, report(verified=False))
    assert ws.implementation(b)["status"] == "failed"
    assert len(ws.checks(b)) == 2 and len(ws.checks(b, history=True)) == 4
    assert not ws.checks(b)[0]["passed"]
    assert len(ws.evaluations(b)) == 2
    # frontier: verified/eligible/promoted, best objective first; failed never
    assert [r["id"] for r in ws.frontier("toy")] == [c, root]
    with pytest.raises(WorkspaceError, match="failed"):
        ws.add_implementation("toy", toy_source(5), parents=[a], proposer="tuner")


def test_promotion_queue_decisions_and_tags(ws, root):
    e = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="tuner")
    ws.record_evaluation(e, report(eligible=True, objective=9.0))
    f = ws.add_implementation("toy", toy_source(3), parents=[root], proposer="tuner")
    ws.record_evaluation(f, report(eligible=True, objective=8.0))
    assert [r["id"] for r in ws.promotion_queue()] == [e, f]
    assert ws.incumbent("toy")["id"] == root
    ws.decide(e, "promote", by="alice", reason="faster")
    ws.decide(f, "reject", by="bob", reason="unclear")
    assert ws.promotion_queue() == []
    assert ws.incumbent("toy")["id"] == e
    assert ws.implementation(f)["status"] == "rejected"
    assert [(d["action"], d["by"]) for d in ws.decisions(e)] == [("promote", "alice")]
    repo = git.Repo(ws.path / "repo")
    try:
        tag = repo.tags[f"promoted/toy/{e}"]
        assert tag.tag is not None, "promotion tags are annotated"
        assert tag.commit.hexsha == ws.implementation(e)["commit"]
        assert f"promoted/toy/{f}" not in [t.name for t in repo.tags]
        assert f"promoted/toy/{root}" in [t.name for t in repo.tags]
    finally:
        repo.close()
    with pytest.raises(WorkspaceError, match="cannot be rejected"):
        ws.decide(e, "reject", by="carol")
    bad = ws.add_implementation("toy", toy_source(4), parents=[root], proposer="tuner")
    ws.record_evaluation(bad, report(verified=False))
    with pytest.raises(WorkspaceError, match="only a verified"):
        ws.decide(bad, "promote", by="carol")
    with pytest.raises(WorkspaceError, match="unknown action"):
        ws.decide(bad, "delete", by="carol")
    # archive: recorded as such, leaves frontier; a failed one stays failed
    v = ws.add_implementation("toy", toy_source(5), parents=[root], proposer="tuner")
    ws.record_evaluation(v, report(objective=11.9))
    ws.decide(v, "archive", by="agent", reason="dead end")
    ws.decide(bad, "archive", by="agent")
    assert ws.implementation(v)["status"] == "rejected" and ws.implementation(bad)["status"] == "failed"
    assert v not in [r["id"] for r in ws.frontier("toy")]
    assert ws.doctor(in_flight_s=0) == []


def test_foreign_keys_are_enforced(ws, root):
    conn = sqlite3.connect(ws.db_path)
    try:
        # the store's own connections turn them on; prove the schema declares them
        conn.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO decisions (impl_id, action, by, created) VALUES (999, 'reject', 'x', 'now')")
    finally:
        conn.close()
    assert ws.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert ws.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(sqlite3.IntegrityError):
        ws.record_llm_usage(12345, model="m", input_tokens=1, output_tokens=1, cost_usd=0.1)
    with pytest.raises(UnknownImplementation):
        ws.add_implementation("toy", TOY, parents=[424242], proposer="tuner")
    with pytest.raises(WorkspaceError, match="unknown operator"):
        ws.add_implementation("nope", TOY, proposer="tuner")
    with pytest.raises(WorkspaceError, match="unknown status"):
        ws.set_status(root, "great")


def test_open_errors(tmp_path):
    with pytest.raises(WorkspaceError, match=r"no TIK workspace at .*missing \(run `tik init`\)"):
        Workspace.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(WorkspaceError, match="no TIK workspace"):
        Workspace.open(tmp_path / "plain")
    Workspace.init(tmp_path / "w").close()
    with pytest.raises(WorkspaceError, match="already a TIK workspace"):
        Workspace.init(tmp_path / "w")
    (tmp_path / "w" / "tik.db").write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "w" / f"tik.db{suffix}").unlink(missing_ok=True)
    with pytest.raises(WorkspaceError, match="corrupt workspace database"):
        Workspace.open(tmp_path / "w")
    other = tmp_path / "other"
    other.mkdir()
    sqlite3.connect(other / "tik.db").execute("CREATE TABLE t (x)").connection.close()
    git.Repo.init(other / "repo", bare=True).close()
    with pytest.raises(WorkspaceError, match="not a TIK workspace"):
        Workspace.open(other)


def test_events_commands_worker_usage_opportunities(ws, root):
    first = ws.last_event_id()
    eid = ws.append_event("note", {"x": 1}, op="toy", impl_id=root)
    evs = ws.events_since(first)
    assert [e["id"] for e in evs] == [eid] and evs[0]["payload"] == {"x": 1}
    assert ws.events_since(0, limit=2)[0]["id"] == 1 and len(ws.events_since(0, limit=2)) == 2
    c1, c2 = ws.send_command("pause"), ws.send_command("stop", {"why": "test"})
    taken = ws.take_commands()
    assert [(c["id"], c["kind"]) for c in taken] == [(c1, "pause"), (c2, "stop")]
    assert taken[1]["payload"] == {"why": "test"}
    assert ws.take_commands() == []
    ws.set_worker_state(pid=__import__("os").getpid(), state="running", op="toy", proposer="tuner", budget=10,
                        spent=2, message="working", iteration=3)
    w = ws.worker_state()
    assert (w["state"], w["op"], w["budget"], w["spent"], w["iteration"], w["alive"]) == (
        "running", "toy", 10, 2, 3, True)
    with pytest.raises(WorkspaceError):
        ws.set_worker_state(state="dancing")
    ws.record_llm_usage(root, model="claude-x", input_tokens=100, output_tokens=50, cache_read_tokens=10,
                        cost_usd=0.25)
    ws.record_llm_usage(None, model="claude-y", input_tokens=1, output_tokens=2, cost_usd=0.05)
    impl = ws.add_implementation("toy", toy_source(2), parents=[root], proposer="claude",
                                 usage={"model": "claude-x", "input_tokens": 7, "output_tokens": 3, "cost_usd": 0.1})
    tot = ws.llm_usage_totals()
    assert (tot["calls"], tot["input_tokens"], tot["output_tokens"]) == (3, 108, 55)
    assert tot["cost_usd"] == pytest.approx(0.4) and tot["by_model"]["claude-x"]["calls"] == 2
    assert ws.implementation(impl)["usage"]["input_tokens"] == 7
    oid = ws.add_opportunity("toy", "fuse the epilogue", workloads=["T=1"], evidence="profile")
    ws.update_opportunity(oid, status="tried", impl_id=impl)
    assert ws.opportunities("toy") == ws.opportunities() and ws.opportunities("other") == []
    assert (ws.opportunities()[0]["status"], ws.opportunities()[0]["workloads"]) == ("tried", ["T=1"])
    with pytest.raises(WorkspaceError):
        ws.update_opportunity(oid, colour="red")
    ws.ensure_operator("toy", "a toy operator", {"entries": ["toy"]}, "fp-2")
    assert ws.operators()[0]["fingerprint"] == "fp-2"
    assert ws.root("toy")["id"] == root
    assert set(STATUSES) == {"candidate", "failed", "verified", "eligible", "promoted", "rejected"}


def test_a_thousand_node_tree_with_merges_round_trips(tmp_path):
    """1,200 derivations, random parents (one in ten a merge): rows, git parentage, lineage and frontier agree
    with an independent model of the tree, also after reopening."""
    rng = random.Random(42)
    ws = Workspace.init(tmp_path / "big")
    ws.ensure_operator("toy", "", {}, "fp")
    ids = [ws.add_implementation("toy", toy_source(0), proposer="root", status="promoted")]
    model = {ids[0]: []}
    objective = {ids[0]: None}
    verified = {ids[0]}
    for i in range(1, 1200):
        k = 2 if rng.random() < 0.1 and len(verified) > 1 else 1
        parents = rng.sample(sorted(verified), k)
        impl = ws.add_implementation("toy", toy_source(i), parents=parents, proposer="tuner", rationale=f"n{i}")
        model[impl] = parents
        ids.append(impl)
        if rng.random() < 0.7:
            obj = rng.uniform(1, 100)
            ws.record_evaluation(impl, report(objective=obj))
            verified.add(impl)
            objective[impl] = obj
        elif rng.random() < 0.5:
            ws.record_evaluation(impl, report(verified=False))
    ws.close()
    ws = Workspace.open(tmp_path / "big")
    rows = {r["id"]: r for r in ws.implementations(op="toy")}
    assert {i: r["parents"] for i, r in rows.items()} == model
    for impl in rng.sample(ids, 40):
        chain, cur = [], impl
        while True:
            chain.append(cur)
            if not model[cur]:
                break
            cur = model[cur][0]
        assert [r["id"] for r in ws.lineage(impl)] == chain[::-1]
        assert sorted(r["id"] for r in ws.children(impl)) == sorted(c for c, ps in model.items() if impl in ps)
    front = [r["id"] for r in ws.frontier("toy")]
    want = sorted((i for i in verified if i != ids[0]), key=lambda i: objective[i]) + [ids[0]]
    assert front == want
    commits = {i: r["commit"] for i, r in rows.items()}
    parents = ws.git.commits_info(list(commits.values()))
    assert all(parents[commits[i]] == [commits[p] for p in ps] for i, ps in model.items())
    assert ws.doctor(in_flight_s=0) == []
    ws.close()


def test_threads_share_one_workspace(ws, root):
    """One connection per thread, one git Repo behind a lock: concurrent threads lose nothing."""
    import threading

    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(15):
                impl = ws.add_implementation("toy", toy_source(100 * k + i), parents=[root], proposer=f"t{k}")
                ws.record_evaluation(impl, report(objective=float(i + 1)))
                ws.append_event("thread", {"k": k, "i": i})
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r["proposer"] for r in ws.children(root)) == sorted(f"t{k}" for k in range(4) for _ in range(15))
    assert len([e for e in ws.events_since(0, limit=10_000) if e["kind"] == "thread"]) == 60
    assert ws.doctor(in_flight_s=0) == []


def test_the_control_channel_opens_alone(ws, tmp_path):
    """`Channel.open` reads and writes the same rows as the workspace, without the git repository."""
    from tik_store.channel import Channel

    ws.send_command("pause")
    with Channel.open(ws.path) as channel:
        assert not hasattr(channel, "git")
        assert [c["kind"] for c in channel.take_commands()] == ["pause"]
        channel.set_worker_state(state="running", pid=os.getpid(), message="beating")
        channel.append_event("probe", {"n": 1})
    assert ws.take_commands() == []
    assert ws.worker_state()["message"] == "beating" and ws.worker_state()["alive"]
    assert ws.events(kind="probe")[0]["payload"] == {"n": 1}
    with pytest.raises(WorkspaceError, match="no TIK workspace"):
        Channel.open(tmp_path / "nothing")
