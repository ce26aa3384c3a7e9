"""The candidate sandbox (evaluator/sandbox.py, spawn.py, isolate.py), attacked by planted candidates (planted.py): each
attack is rejected with its reason in the report, or made harmless, and the same attack without the sandbox
shows what the sandbox stops. Also: nothing outlives a SIGKILLed evaluator, and the evaluator refuses to run
once its trusted files changed. The attacks run in the evaluator's own process run twice (`started`, conftest.py):
against a child started by the launcher and against one forked by the fork server. The library's roots verified in
the jail: test_eval_cli (rmsnorm, CPU) and test_evaluator_gpu (every root), since every child runs in it."""

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from evaluator_fixtures import FIX, tiny
from planted import WRITABLE, alive_with, child_dirs, kill_all, planted

from tik_kernels.evaluator import evaluate, integrity, sandbox, spawn

REPO = Path(__file__).resolve().parents[2]
CHECKS = REPO / "tik_kernels" / "evaluator" / "checks.py"
ROOT_SOURCE = (FIX / "tiny_root.py").read_text()
MODE, WHY = sandbox.availability()
jailed = pytest.mark.skipif(MODE is None, reason=f"the kernel refuses the sandbox's namespaces here: {WHY}")


def run(path: Path, **kw):
    return evaluate(tiny(), path, root_path=FIX / "tiny_root.py", device="cpu", timeout=60, **kw)


@pytest.fixture(autouse=True)
def _sandbox_in_force():
    """No test here starts with the sandbox switched off by a leaked $TIK_UNSAFE_NO_SANDBOX: a planted attack
    would then reach this machine (the guards in planted.py are the second line)."""
    if MODE is not None:
        assert not sandbox.unsafe(), "TIK_UNSAFE_NO_SANDBOX leaked into the sandbox's tests"
    yield


def write(tmp_path: Path, kind: str, **literals) -> Path:
    path = tmp_path / f"planted_{kind}.py"
    path.write_text(planted(kind, ROOT_SOURCE, **literals))
    return path


def driver(*args: str, env: dict, timeout: float = 120) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("sandbox_driver.py")), *args],
                            env={**os.environ, "PYTHONPATH": str(REPO), **env}, stdout=subprocess.PIPE, text=True)


def _wait_gone(marker: str, seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    while (pids := alive_with(marker)) and time.monotonic() < end:
        time.sleep(0.1)
    return pids


@jailed
def test_the_child_sees_its_files_read_only_and_nothing_of_the_parent(started, tmp_path):
    probe = tmp_path / "look.py"
    probe.write_text(f"""
import json, os
{WRITABLE}
seen = {{"uid": os.getuid(), "checkout": os.path.exists({str(REPO)!r}), "pids": sorted(
    int(p) for p in os.listdir("/proc") if p.isdigit()), "net": sorted(
    ln.split(":")[0].strip() for ln in open("/proc/net/dev").read().splitlines()[2:]),
    "cap": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
    "writable": [p for p in ("/", "/usr", "/etc", "/tik/runtime/tik_kernels", "/tik/impl", "/tmp") if writable(p)],
    "runtime": sorted(os.listdir("/tik/runtime")), "tests": os.path.exists("/tik/runtime/tests")}}
raise RuntimeError("SEEN" + json.dumps(seen))
""")
    rep = run(probe)
    seen = json.loads(rep.failure.partition("SEEN")[2])
    assert seen["uid"] != 0 and seen["cap"] == "0000000000000000"
    assert not seen["checkout"] and seen["runtime"] == ["tik_kernels"] and not seen["tests"]
    # pid 1 (the namespace's init) and the child: no process of the parent's is there
    assert seen["pids"] == [1, 2], seen["pids"]
    assert seen["net"] == ["lo"] and seen["writable"] == ["/tmp"]


@jailed
def test_the_parents_environment_is_out_of_reach(tmp_path):
    """A key in the evaluator's environment (as `tik check` or a worker starts with it): the candidate reads
    /proc/<ancestor>/environ, /proc/1/environ and every process in sight, and finds nothing in the jail."""
    path = write(tmp_path, "environ")
    proc = driver(str(path), f"{path}@unsafe", env={"ANTHROPIC_API_KEY": "sk-ant-planted-test"})
    out, _ = proc.communicate(timeout=180)
    jailed_rep, unsafe_rep = (json.loads(line) for line in out.splitlines())
    assert "RuntimeError: no key in the " in jailed_rep["failure"], jailed_rep["failure"]
    assert "RuntimeError: found ANTHROPIC_API_KEY in /proc/" in unsafe_rep["failure"], unsafe_rep["failure"]


@jailed
def test_the_workspace_cannot_be_written(started, tmp_path):
    db = tmp_path / "ws" / "tik.db"
    db.parent.mkdir()
    db.write_bytes(b"SQLite format 3\x00" + bytes(100))
    before = db.read_bytes()
    rep = run(write(tmp_path, "workspace", DB=str(db), SCAN=True))
    assert not rep.verified and "No such file or directory" in rep.failure and str(db) in rep.failure, rep.failure
    assert db.read_bytes() == before
    # without the jail the same file is written (no /proc scan there: this machine's other workspaces)
    rep = run(write(tmp_path, "workspace", DB=str(db), SCAN=False), sandbox=False)
    assert rep.failure == "import failed: RuntimeError: wrote 1 database(s)"
    assert db.read_bytes().startswith(b"PLANTED")


@jailed
def test_the_evaluator_cannot_be_edited(started, tmp_path):
    before = hashlib.sha256(CHECKS.read_bytes()).hexdigest()
    rep = run(write(tmp_path, "evaluator", CHECKS=str(CHECKS)))
    assert not rep.verified
    assert "Read-only file system" in rep.failure or "Permission denied" in rep.failure, rep.failure
    assert "/tik/runtime/tik_kernels/evaluator/checks.py" in rep.failure
    assert hashlib.sha256(CHECKS.read_bytes()).hexdigest() == before and integrity.changed() is None


@jailed
def test_a_daemon_dies_with_its_evaluation(started, tmp_path):
    marker = f"tik-planted-{uuid.uuid4().hex}"
    rep = run(write(tmp_path, "fork_and_tell", MARKER=marker))
    assert rep.failure == "import failed: RuntimeError: a daemon started"
    assert _wait_gone(marker, 5) == []
    try:  # without the jail the grandchild, in a session of its own, outlives the evaluation
        rep = run(write(tmp_path, "fork_and_tell", MARKER=marker), sandbox=False)
        assert rep.failure == "import failed: RuntimeError: a daemon started"
        end = time.monotonic() + 10  # the grandchild may not have exec'd (shown its marker) yet
        while not alive_with(marker) and time.monotonic() < end:
            time.sleep(0.1)
        assert alive_with(marker)
    finally:
        kill_all(marker)


@jailed
def test_a_reply_that_points_elsewhere_is_not_followed(started, tmp_path, monkeypatch):
    """The candidate swaps the child's result.json for a symlink to a file of the parent's (here a decoy with a
    reply in it): the parent refuses to follow it; without that check it would read the decoy as the reply."""
    target = tmp_path / "secret.json"
    target.write_text(json.dumps({"done": True, "import_error": "LEAKED the parent's file"}))
    path = write(tmp_path, "symlink", TARGET=str(target))
    rep = run(path)
    assert not rep.verified and "'result.json' is not a plain file" in rep.failure, rep.failure
    monkeypatch.setattr(spawn, "_plain", lambda out: None)  # where _read_reply reads it
    rep = run(path)
    assert rep.failure == "import failed: LEAKED the parent's file"


@jailed
def test_no_network(started, tmp_path):
    rep = run(write(tmp_path, "network"))
    assert not rep.verified and "Network is unreachable" in rep.failure, rep.failure


@jailed
def test_sigkill_of_the_evaluator_leaves_no_process_and_the_scratch_is_reaped(tmp_path):
    """SIGKILL the evaluating process while its candidate hangs with a daemon grandchild: 5 s later nothing of
    the evaluation is alive, and `reap_stale` (what a resumed worker runs) removes its scratch directory."""
    marker = f"tik-planted-{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = driver(str(write(tmp_path, "hang", MARKER=marker)), env={"TMPDIR": str(tmp)})
    try:
        end = time.monotonic() + 120
        while not alive_with(marker) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        assert alive_with(marker), "the candidate's daemon never started"
        scratch = child_dirs(tmp, pid=proc.pid)
        assert scratch
        proc.kill()
        proc.wait(10)
        time.sleep(5)
        assert alive_with(marker) == [] and alive_with(str(tmp)) == []
    finally:
        proc.kill()
        kill_all(marker)
    # its scratch, and every other directory it owned (the kept plan's inputs file: `core._link_inputs`)
    owned = [d.name for d in tmp.iterdir() if sandbox.OWNED.match(d.name) and f"-{proc.pid}." in d.name]
    assert {d.relative_to(tmp).parts[0] for d in scratch} <= set(owned)
    assert sandbox.reap_stale(tmp) == (0, len(owned))
    assert [d.name for d in tmp.iterdir() if d.name in owned] == [] and not any(d.exists() for d in scratch)


def test_reap_stale_keeps_live_owners_and_unowned_directories(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"tik-eval-{dead.pid}.1-abc"
    live = tmp_path / f"tik-eval-{os.getpid()}.{sandbox._start_time(os.getpid())}-x"
    for d in (stale, live, tmp_path / "tik-eval-unowned"):
        d.mkdir()
    assert sandbox.reap_stale(tmp_path) == (0, 1)
    assert not stale.exists() and live.exists() and (tmp_path / "tik-eval-unowned").exists()


def test_a_trusted_file_changed_between_evaluations_is_refused(tmp_path, monkeypatch):
    """Another process edits the evaluator (a copy of its trusted files here) after it started: the next
    evaluation fails with the file named, before any child runs."""
    copy = tmp_path / "tik_kernels"
    for rel in integrity.digests():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((integrity.ROOT / rel).read_bytes())
    monkeypatch.setattr(integrity, "ROOT", copy)
    monkeypatch.setattr(integrity, "BASELINE", integrity.digests())
    assert integrity.changed() is None
    with open(copy / "evaluator" / "checks.py", "a") as f:
        f.write("\n# every check passes\n")
    (copy / "contracts" / "extra.py").write_text("")
    t0 = time.monotonic()
    rep = run(FIX / "good.py")
    assert not rep.verified and time.monotonic() - t0 < 5
    assert rep.failure.startswith("the evaluator's trusted files changed since this process started "
                                  "(tik_kernels/contracts/extra.py, tik_kernels/evaluator/checks.py)"), rep.failure
    assert [c.name for c in rep.checks if not c.passed] == ["integrity"]


def test_where_namespaces_are_refused_candidates_do_not_run(monkeypatch, tmp_path, capsys):
    from tik_tui.cli.main import main

    monkeypatch.setattr(sandbox, "_AVAILABLE", (None, "unshare: Operation not permitted"))
    # set (not deleted) so that the teardown restores it: sandbox_choice below exports "1"
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "0")
    rep = run(FIX / "good.py")
    assert not rep.verified and rep.failure.startswith(
        "the candidate sandbox cannot start here (unshare: Operation not permitted)"), rep.failure
    assert [c.name for c in rep.checks] == ["sandbox"]
    impl = tmp_path / "rmsnorm.py"
    impl.write_text((REPO / "tik_kernels" / "ops" / "rmsnorm.py").read_text())
    for argv in (["check", "rmsnorm", "--impl", str(impl), "--device", "cpu"],
                 ["bench", "rmsnorm", "--impl", str(impl), "--device", "cpu"],
                 ["-w", str(tmp_path / "ws"), "search", "--op", "rmsnorm", "--proposer", "tuner"]):
        if argv[2] == "search":
            assert main(["-w", argv[1], "init"]) == 0
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tik: error: the candidate sandbox cannot start here"), err
    # the explicit opt-out runs it, and a detached worker gets the flag
    assert main(["check", "rmsnorm", "--impl", str(impl), "--device", "cpu", "--unsafe-no-sandbox", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"]
    from tik_tui.worker import add_search_options, sandbox_choice, search_argv

    parser = argparse.ArgumentParser()
    add_search_options(parser)
    args = parser.parse_args(["--unsafe-no-sandbox"])
    assert "--unsafe-no-sandbox" in search_argv(args)
    assert sandbox_choice(args) is None and os.environ[sandbox.UNSAFE_ENV] == "1"


@jailed
def test_a_search_records_why_planted_candidates_failed(tmp_path, capsys):
    """Through the worker's loop and the real evaluator: a replay proposer proposes rmsnorm's root with an attack
    in front; each derivation fails with the attack's reason in the store, and the store is intact."""
    from tik_store import Workspace
    from tik_tui.cli.main import main
    from tik_tui.worker import run_search

    ws = tmp_path / "ws"
    assert main(["-w", str(ws), "init"]) == 0
    capsys.readouterr()
    root = (REPO / "tik_kernels" / "ops" / "rmsnorm.py").read_text()
    attacks = {"workspace": dict(DB=str(ws / "tik.db"), SCAN=True), "evaluator": dict(CHECKS=str(CHECKS))}
    replay = tmp_path / "attacks.jsonl"
    replay.write_text("".join(json.dumps({"parent": "root", "source": planted(kind, root, **lit),
                                          "rationale": f"planted: {kind}"}) + "\n" for kind, lit in attacks.items()))
    s = run_search(ws, ops=["rmsnorm"], proposer=f"replay:{replay}", budget=2, device="cpu", timeout=120)
    assert s["spent"] == 2, s
    with Workspace.open(ws) as w:
        failures = {w.implementation(i)["rationale"]: w.implementation(i) for i in s["derivations"]}
        assert {r["status"] for r in failures.values()} == {"failed"}
        why = {k.removeprefix("planted: "): r["failure"] for k, r in failures.items()}
        assert "No such file or directory" in why["workspace"] and "tik.db" in why["workspace"], why
        assert "/tik/runtime/tik_kernels/evaluator/checks.py" in why["evaluator"], why
        assert w.root("rmsnorm")["status"] == "promoted"


@pytest.mark.gpu
@jailed
def test_a_gpu_child_in_the_jail_has_its_device_and_nothing_else(tmp_path):
    """CUDA and a Triton kernel (compiled in the child: its launcher needs the system's compiler and Python's
    headers, read-only) inside the jail; the device nodes are there, the parent's processes are not."""
    probe = tmp_path / "look_gpu.py"
    probe.write_text('''
import json, os
import torch
import triton
import triton.language as tl


@triton.jit
def _twice(x_ptr, y_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y_ptr + o, tl.load(x_ptr + o) * 2)


x = torch.ones(1024, device="cuda")
y = torch.empty_like(x)
_twice[(1,)](x, y, N=1024)
nodes = [d for d in os.listdir("/dev") if d.startswith("nvidia")]
seen = {"sum": float(y.sum()), "uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "ctl": "nvidiactl" in nodes, "gpus": sum(d[6:].isdigit() for d in nodes)}
raise RuntimeError("SEEN" + json.dumps(seen))
''')
    rep = evaluate(tiny(), probe, root_path=FIX / "tiny_root.py", device="cuda", timeout=300)
    assert "SEEN" in (rep.failure or ""), rep.failure
    seen = json.loads(rep.failure.partition("SEEN")[2])
    assert seen["sum"] == 2048.0 and seen["uid"] != 0 and seen["pids"] == [1, 2]
    assert seen["ctl"] and seen["gpus"] >= 1


def test_a_starting_worker_reaps_what_a_killed_evaluator_left(tmp_path, monkeypatch, capsys):
    """A scratch directory whose owner is dead, and a process still running in it: the worker kills the process,
    removes the directory and records it, before its search starts."""
    import tempfile

    from tik_store import Workspace
    from tik_tui.cli.main import main
    from tik_tui.worker import run_search

    ws = tmp_path / "ws"
    assert main(["-w", str(ws), "init"]) == 0
    capsys.readouterr()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp / f"tik-eval-{dead.pid}.1-left"
    (stale / "scratch").mkdir(parents=True)
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(stale / "spec.json")])
    # until the child has exec'd, its /proc cmdline is still this process's (a loaded machine takes a while)
    deadline = time.monotonic() + 20
    while str(stale) not in Path(f"/proc/{leftover.pid}/cmdline").read_bytes().decode(errors="replace"):
        assert time.monotonic() < deadline, "the leftover process never showed its command line"
        time.sleep(0.01)
    try:
        s = run_search(ws, ops=["rmsnorm"], proposer="tuner", budget=0, device="cpu")
        assert leftover.wait(10) == -signal.SIGKILL and not stale.exists()
    finally:
        leftover.kill()
    with Workspace.open(ws) as w:
        reaped = [e["payload"] for e in w.events(kind="sandbox_reaped")]
    assert reaped == [{"processes": 1, "directories": 1, "search": s["search"]}]


@jailed
def test_an_evaluations_candidate_children_share_one_triton_cache_and_no_other_child_sees_it(tmp_path):
    """cache="candidate": the candidate's probe child and timing child of one evaluation share a Triton cache
    (kernels compiled for the probes are loaded when timed); a child of another mode, or of another evaluation,
    gets its own; the shared one is gone when the evaluation ends."""
    from tik_kernels.evaluator.protocol import TensorWriter

    impl = tmp_path / "cache_look.py"
    impl.write_text("import os\nd = os.environ['TRITON_CACHE_DIR']\n"
                    "seen = sorted(os.listdir(d)) if os.path.isdir(d) else []\n"
                    "os.makedirs(d, exist_ok=True)\nopen(os.path.join(d, 'by-candidate'), 'w').close()\n"
                    "raise RuntimeError('SEEN' + repr(seen))\n")
    job = {"mode": "probes", "impl": str(impl), "device": "cpu", "limits": sandbox.limits(60), "graph_probes": []}

    def inputs(tmp: Path) -> dict:
        return {"probes": [], "tensors": TensorWriter(tmp / "inputs.bin").close()}

    def seen(cache: str) -> str:
        out = spawn.run_child(job, inputs, lambda out, doc: doc["import_error"], 60, cache=cache)
        assert out.failure is None, out.failure
        return out.doc.partition("SEEN")[2]

    before = set(Path(sandbox.tempfile.gettempdir()).glob(f"tik-cand-triton-{os.getpid()}.*"))
    fresh = seen("seeded")  # a copy of the trusted cache: what any child starts from
    assert "by-candidate" not in fresh
    with sandbox.candidate_cache():
        assert seen("candidate") == fresh
        assert seen("candidate") == repr(sorted([*eval(fresh), "by-candidate"]))
        assert seen("seeded") == fresh
    assert seen("candidate") == fresh
    assert set(Path(sandbox.tempfile.gettempdir()).glob(f"tik-cand-triton-{os.getpid()}.*")) == before
