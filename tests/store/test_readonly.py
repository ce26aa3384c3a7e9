"""The viewer's open (`Workspace.open(path, readonly=True)`, used by `tik log | show | status`): it never
writes, never waits on a writer, imports neither GitPython nor sqlite-utils, and leaves repairs to the next
writer's open."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_support import TOY, report, toy_source

from tik_store import Workspace, WorkspaceError
from tik_store.gitfiles import PENDING_PREFIX, read_loose, read_refs
from tik_tui.cli.store_cmds import _write_json_list

PROCS = Path(__file__).with_name("_procs.py")
ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("git", "gitdb", "sqlite_utils", "torch", "triton", "numpy", "kernels", "textual", "anthropic")


def _tree(ws: Workspace, root: int, n: int = 5) -> list[int]:
    ids = [root]
    for i in range(1, n):
        parents = [ids[-1], ids[-2]] if i % 3 == 0 else [ids[-1]]
        impl = ws.add_implementation("toy", toy_source(i), parents=parents, proposer="tuner", rationale=f"n{i}")
        ws.record_evaluation(impl, report(objective=10.0 - i))
        ids.append(impl)
    return ids


def _stale_orphan(ws: Workspace, root: int) -> str:
    """A writer SIGKILLed between its git write and its row, long enough ago to be recovered; its pending ref."""
    out = subprocess.run([sys.executable, str(PROCS), "kill_between_git_and_db", str(ws.path), str(root)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode < 0, out.stderr[-2000:]
    (ref,) = read_refs(ws.repo_path, PENDING_PREFIX)
    old = time.time() - 120
    os.utime(ws.repo_path / ref, (old, old))
    return ref


def test_read_commands_import_no_git_sqlite_utils_or_torch(ws, root):
    ids = _tree(ws, root)
    code = (
        "import contextlib, io, json, sys\n"
        "from tik_tui.cli.main import main\n"
        "for argv in (['log', '--json'], ['log'], ['show', sys.argv[2]], ['show', sys.argv[2], '--diff'],\n"
        "             ['status', '--json']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main([*argv, '-w', sys.argv[1]]) == 0, argv\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ws.path), str(ids[-1])], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == []


def test_log_does_not_wait_for_a_writer_and_leaves_the_repair_to_it(ws, root):
    """A writer holds the write lock while a killed writer's orphan commit waits to be recorded: `tik log`
    answers at once (it used to try the repair and wait out the 30 s busy timeout), and a writer's open
    still records the orphan."""
    ids = _tree(ws, root, 3)
    ref = _stale_orphan(ws, root)
    with ws._tx():
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "tik_tui.cli.main", "log", "--json", "-w", str(ws.path)],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        elapsed = time.perf_counter() - t0
    assert out.returncode == 0 and out.stderr == "", out.stderr[-2000:]
    assert [r["id"] for r in json.loads(out.stdout)] == ids
    assert elapsed < 10, f"tik log waited {elapsed:.1f} s on the writer's lock"
    assert ref in read_refs(ws.repo_path, PENDING_PREFIX), "a reader must not repair"
    with Workspace.open(ws.path) as writer:
        rows = writer.implementations()
        assert [r["id"] for r in rows[:-1]] == ids and rows[-1]["rationale"] == "fuse the epilogue"
        assert read_refs(writer.repo_path, PENDING_PREFIX) == {}
        assert writer.doctor(in_flight_s=0) == []


def test_readonly_refuses_every_write(ws, root):
    objects = sorted(p.relative_to(ws.repo_path) for p in (ws.repo_path / "objects").rglob("*"))
    refs = read_refs(ws.repo_path, "refs/")
    with Workspace.open(ws.path, readonly=True) as ro:
        assert ro.implementations() == ws.implementations() and ro.source(root) == TOY
        for write in (lambda: ro.add_implementation("toy", toy_source(9), parents=[root], proposer="tuner"),
                      lambda: ro.decide(root, "promote", by="x"), lambda: ro.set_worker_state(state="running"),
                      lambda: ro.send_command("pause"), lambda: ro.git.set_ref("refs/derivations/99", "0" * 40)):
            with pytest.raises(WorkspaceError, match="opened read-only"):
                write()
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.db.execute("UPDATE implementations SET status = 'failed'")
    assert sorted(p.relative_to(ws.repo_path) for p in (ws.repo_path / "objects").rglob("*")) == objects
    assert read_refs(ws.repo_path, "refs/") == refs
    assert [r["status"] for r in ws.implementations()] == ["promoted"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git program to pack the repository")
def test_sources_in_a_pack_are_read_through_gitpython(ws, root):
    ids = _tree(ws, root)
    want = {i: ws.source(i) for i in ids}
    subprocess.run(["git", "-C", str(ws.repo_path), "repack", "-a", "-d", "-q"], check=True, timeout=120)
    subprocess.run(["git", "-C", str(ws.repo_path), "prune-packed"], check=True, timeout=120)
    row = ws._row(ids[-1])
    assert read_loose(ws.repo_path, row["blob_sha"]) is None
    with Workspace.open(ws.path, readonly=True) as ro:
        assert {i: ro.source(i) for i in ids} == want
        assert ro.diff(ids[-1]).startswith(f"--- #{ids[-2]}/toy.py")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git program to pack the repository")
def test_commits_in_a_pack_read_as_loose_ones(ws, root):
    """tik_store.gitrepo parses commits and trees itself (GitPython's pure-Python object database is deprecated
    as a Repo backend): packed commits read back as they did loose, a merge with both parents, a blob is no
    commit, and `tik doctor` still finds the commits agree with their rows."""
    ids = _tree(ws, root)
    shas = [ws._row(i)["commit_sha"] for i in ids]
    loose = {s: ws.git.commit_info(s) for s in shas}
    assert [len(loose[s]["parents"]) for s in shas] == [0, 1, 1, 2, 1]
    assert loose[shas[1]]["filename"] == "toy.py" and "n1" in loose[shas[1]]["message"]
    subprocess.run(["git", "-C", str(ws.repo_path), "repack", "-a", "-d", "-q"], check=True, timeout=120)
    subprocess.run(["git", "-C", str(ws.repo_path), "prune-packed"], check=True, timeout=120)
    ws.git.close()
    assert read_loose(ws.repo_path, shas[-1]) is None
    assert {s: ws.git.commit_info(s) for s in shas} == loose
    assert ws.git.commits_info(shas) == {s: loose[s]["parents"] for s in shas}
    assert ws.git.commit_info(ws._row(ids[1])["blob_sha"]) is None
    assert ws.doctor(in_flight_s=0) == []


def test_loose_objects_read_as_gitpython_reads_them(ws, root):
    ids = _tree(ws, root)
    for i in ids:
        row = ws._row(i)
        for sha in (row["blob_sha"], row["commit_sha"]):
            assert read_loose(ws.repo_path, sha) == ws.git.read_object(sha)
    path = ws.repo_path / "objects" / row["blob_sha"][:2] / row["blob_sha"][2:]
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="corrupt git object"):
        read_loose(ws.repo_path, row["blob_sha"])


def test_batches_and_their_json_are_the_whole_list(ws, root, capsys):
    _tree(ws, root, 7)
    rows = ws.implementations()
    for batch in (1, 2, 3, 7, 100):
        batches = list(ws.iter_implementations(batch=batch))
        assert all(len(b) == batch for b in batches[:-1]) and [r for b in batches for r in b] == rows
        _write_json_list(iter(batches))
        assert capsys.readouterr().out == json.dumps(rows, default=str) + "\n"
    assert [r["id"] for b in ws.iter_implementations(status="promoted") for r in b] == [root]
    for empty in ([], [[]]):
        _write_json_list(iter(empty))
        assert capsys.readouterr().out == "[]\n"


def test_query_keeps_repeated_column_names(ws, root):
    assert list(ws.db.query("SELECT 1 AS a, 2 AS a, 3 AS b")) == [{"a": 1, "a_2": 2, "b": 3}]


def test_log_into_a_reader_that_goes_away_stops_quietly(ws, root):
    # `tik log | head -1`: more rows than a pipe buffers, and the reader closes after one line
    _tree(ws, root, n=600)
    proc = subprocess.Popen([sys.executable, "-m", "tik_tui.cli.main", "log", "-w", str(ws.path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().split()[:2] == [b"id", b"op"]
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
