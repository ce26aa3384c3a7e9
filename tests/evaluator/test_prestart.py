"""Pre-started candidate children (spares.Spares): a timed evaluation takes the child started during the previous
one, which serves that one candidate and no other; a dead spare is replaced by a fresh child; a planted cheat run
through a spare fails exactly as it does through a fresh child; nothing is left once the evaluator exits, cleanly
(atexit) or killed (`reap_stale`).

Each test gets a pool of its own (pytest changes $PYTEST_CURRENT_TEST between tests, so a spare of an earlier test
would not match anyway: its environment is not the one a child started now would get)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from evaluator_fixtures import FIX, tiny
from planted import alive, child_dirs

from tik_kernels.evaluator import evaluate, sandbox, servers, spares, spawn
from tik_kernels.evaluator.core import warm_root

ROOT = FIX / "tiny_root.py"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _root_warm():
    warm_root(tiny(), device="cpu", timeout=60, root_path=ROOT)


@pytest.fixture
def children(monkeypatch):
    """(launcher pid, pre-started?) of every candidate child, in order, with a pool of spares of this test's own
    (closed at the end: killed, directories removed)."""
    monkeypatch.setenv(spares.PRESTART_ENV, "1")
    pool = spares.Spares()
    monkeypatch.setattr(spares, "SPARES", pool)  # spawn.PhasedChild reads it there
    seen: list[tuple[int, bool]] = []
    first = spawn.PhasedChild.first

    def spy(self, read_result, timeout):
        out = first(self, read_result, timeout)
        seen.append((self.proc.pid, self.prestarted))
        return out

    monkeypatch.setattr(spawn.PhasedChild, "first", spy)
    yield seen
    pool.close()
    assert not pool.pids()


def run(name: str, **kw):
    kw.setdefault("timeout", 30)
    return evaluate(tiny(), FIX / f"{name}.py", root_path=ROOT, device="cpu", time_it=True, **kw)


def forked() -> bool:
    """Whether a CPU candidate's child is forked here (the jail starts): the first evaluation then waits for a
    spare (the fork server's start, then a fork) instead of starting a fresh interpreter beside it."""
    return servers.forks(sandbox.isolation(False)[0], "cpu", "private")


def test_a_spare_serves_one_candidate_and_the_next_evaluation_gets_another(children):
    reps = [run("good") for _ in range(3)]
    assert all(r.verified for r in reps), [r.failure for r in reps]
    assert [pre for _, pre in children] == [forked(), True, True]
    pids = [pid for pid, _ in children]
    assert len(set(pids)) == 3
    assert not any(alive(p) for p in pids)  # each candidate's child is gone when its evaluation returns
    spares.SPARES.settle("cpu")
    [waiting] = spares.SPARES.pids()  # and one spare waits for the next candidate
    assert waiting not in pids and alive(waiting)
    assert spares.SPARES.stats["taken"] == 2 + forked()
    # a spare taken ready reported the parts of its start: its own (the CPU has no device parts) and the parent's
    # (one taken while still starting, as the first can be, had none to report yet)
    st = spares.SPARES.stats
    assert 2 <= st["boot_n"] <= st["taken"] and set(st["boot_s"]) == {"launch", "start", "imports", "spawn"}, st
    assert all(v >= 0 for v in st["boot_s"].values())


def test_settle_waits_for_a_starting_spare_whatever_the_timing_experiment_says(monkeypatch):
    """`settle` serves the CPU's root probes; TIK_SPARE_SETTLE is the GPU timings' (`Spares.quiet`) and moves it not."""
    pool = spares.Spares()
    try:
        pool.pending[("cuda:0", "candidate")] = 1  # one starting: settling waits for it
        assert pool.settle("cuda:0", limit_s=0.3) >= 0.3
        monkeypatch.setenv(spares.SETTLE_ENV, "0")
        assert pool.settle("cuda:0", limit_s=0.3) >= 0.3
    finally:
        pool.pending.clear()
        pool.close()


def test_the_first_forked_child_waits_for_the_fork_server_instead_of_starting_beside_it(children):
    if not forked():
        pytest.skip("no jail here: children are started by the launcher, never forked")
    rep = run("good")
    assert rep.verified, rep.failure
    assert children == [(children[0][0], True)] and rep.phases["probes_candidate_forked"] == 1.0
    assert servers.SERVERS.ready(sandbox.isolation(False)[0], "cpu") is not None


def test_a_dead_spare_is_replaced_by_a_fresh_child_and_the_evaluation_verifies(children):
    assert run("good").verified
    spares.SPARES.settle("cpu")  # (the spare may still be starting, with the fork server before it)
    [spare] = [s for v in spares.SPARES.ready.values() for s in v]
    os.killpg(spare.proc.pid, signal.SIGKILL)
    spare.proc.wait(timeout=10)
    rep = run("good")
    assert rep.verified, rep.failure
    assert children[1][0] != spare.proc.pid and children[1][1] is forked()  # (a fresh spare where children fork)
    assert spares.SPARES.stats["discarded"] == 1 and not spare.tmp.exists()


def test_a_spare_whose_world_changed_is_not_used(children, monkeypatch):
    assert run("good").verified
    spares.SPARES.settle("cpu")
    [spare] = [s for v in spares.SPARES.ready.values() for s in v]
    monkeypatch.setenv("TIK_SOME_SETTING", "changed")  # the child's environment would differ now
    assert run("good").verified
    assert [pre for _, pre in children] == [forked(), forked()] and not alive(spare.proc.pid)
    assert spares.SPARES.stats["discarded"] == 1


def test_a_candidate_spare_cache_is_seeded_topped_up_and_becomes_the_evaluations(children, monkeypatch, tmp_path):
    trusted = tmp_path / "trusted"
    (trusted / "k1").mkdir(parents=True)
    (trusted / "k1" / "kernel.bin").write_text("root's kernel")
    monkeypatch.setattr(sandbox, "_TRUSTED_CACHE", trusted)
    mode = sandbox.isolation(False)[0]
    job = {"device": "cpu", "limits": sandbox.limits(30)}
    spares.SPARES.prime(mode, "cpu", job["limits"], "candidate")
    assert spares.SPARES.settle("cpu") < 30
    (trusted / "k2").mkdir()  # compiled by a trusted child after the spare was seeded
    (trusted / "k2" / "kernel.bin").write_text("another")
    with sandbox.candidate_cache():
        sandbox.triton_cache("candidate", tmp_path)  # this evaluation already has its candidate cache
        assert spares.SPARES.take(mode, job, "candidate") is None
    with sandbox.candidate_cache():
        spare = spares.SPARES.take(mode, job, "candidate")
        assert spare is not None and spare.own_cache is None  # adopted by the evaluation
        assert sorted(p.name for p in spare.cache_dir.iterdir()) == ["k1", "k2"]
        assert sandbox.triton_cache("candidate", tmp_path) == spare.cache_dir  # its later children share it
        spare.discard()
    assert not spare.cache_dir.exists()  # removed with the evaluation


def test_a_forked_copy_of_the_evaluator_neither_takes_nor_kills_its_parents_spares(children):
    mode = sandbox.isolation(False)[0]
    job = {"device": "cpu", "limits": sandbox.limits(30)}
    spares.SPARES.prime(mode, "cpu", job["limits"], "private")
    spares.SPARES.settle("cpu")
    [pid] = spares.SPARES.pids()
    spares.SPARES.cond.acquire()  # held by "another thread" when the process forks
    child = os.fork()
    if child == 0:
        ok = spares.SPARES.take(mode, job, "private") is None and not spares.SPARES.pids()
        spares.SPARES.close()
        os._exit(0 if ok else 1)
    spares.SPARES.cond.release()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert spares.SPARES.pids() == [pid] and alive(pid)


#: fixtures whose cheat or crash is caught in the child or after it: the same report through a spare
CHEATS = ["forges", "mutates", "segfault", "obfuscated_import", "lazy_when_timed", "nosy"]


def test_planted_cheats_fail_the_same_way_through_a_spare(children, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")  # nosy looks for it
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    fresh = {name: run(name) for name in CHEATS}
    assert not any(pre for _, pre in children)
    monkeypatch.setenv(spares.PRESTART_ENV, "1")
    assert run("good").verified  # starts the first spare
    del children[:]
    spared = {name: run(name) for name in CHEATS}
    assert [pre for _, pre in children] == [True] * len(CHEATS)
    for name in CHEATS:
        a, b = fresh[name], spared[name]
        assert (b.verified, b.failure) == (a.verified, a.failure), name
        assert [(c.name, c.passed) for c in b.checks] == [(c.name, c.passed) for c in a.checks], name
    assert spared["nosy"].verified and not spared["forges"].verified  # the fixtures did what they are for


DRIVER = """
import json, os, sys, time
from evaluator_fixtures import FIX, tiny
from planted import descendants
from tik_kernels.evaluator import evaluate, spares

for _ in range(2):
    rep = evaluate(tiny(), FIX / "good.py", root_path=FIX / "tiny_root.py", device="cpu", time_it=True, timeout=30)
    assert rep.verified, rep.failure
assert spares.SPARES.settle("cpu") < 30
print(json.dumps({"pids": descendants(os.getpid()), "spares": spares.SPARES.pids()}), flush=True)
if sys.argv[1] == "hang":
    time.sleep(600)
sys.stdin.readline()  # exits once the test has looked (its atexit removes the spares' directories)
"""


@pytest.mark.parametrize("end", ["exit", "killed"])
def test_no_spare_outlives_the_evaluator(tmp_path, end):
    env = {**os.environ, "TMPDIR": str(tmp_path), spares.PRESTART_ENV: "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "evaluator")])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "hang" if end == "killed" else "exit"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = json.loads(proc.stdout.readline())
    assert len(line["spares"]) == 1 and len(line["pids"]) >= 4  # launcher, holder, init, child
    assert child_dirs(tmp_path, ("spare",))
    if end == "killed":
        proc.kill()
    else:
        proc.stdin.write("\n")
        proc.stdin.flush()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in line["pids"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in line["pids"] if alive(p)]
    if end == "killed":  # no atexit ran: the next evaluator removes the directories
        assert child_dirs(tmp_path, ("spare",))
        sandbox.reap_stale(tmp_path)
    assert not list(tmp_path.glob("tik-*")), list(tmp_path.iterdir())


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_on_the_gpu_a_spare_serves_the_next_candidate_and_its_cache_goes_with_the_evaluation(children):
    import tempfile

    def caches() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob(f"tik-cand-triton-{os.getpid()}.*"))

    # an earlier GPU test of this process left a spare (with its cache) in the process's own pool, which this
    # test's pool replaces: only what appears from here on is this test's
    before = caches()
    reps = [evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cuda", time_it=True, timeout=120)
            for _ in range(2)]
    assert all(r.verified for r in reps), [r.failure for r in reps]
    assert [pre for _, pre in children] == [False, True]
    assert "spare_settle" in reps[1].phases and reps[1].as_dict()["cells"]
    # the used spare's seeded Triton cache was the second evaluation's candidate cache, removed with it: the one
    # left belongs to the spare waiting for a third candidate
    left = caches() - before
    assert len(left) == 1 and len(spares.SPARES.pids()) == 1, (left, before)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def pool():
    """A pool of spares and the process groups a test starts as them (`pool.procs`), all gone after the test."""
    pool = spares.Spares()
    pool.procs = []
    yield pool
    pool.ready.clear()
    pool.close()
    for p in pool.procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_quiet_pauses_starting_spares_and_no_spare_starts_within_it(tmp_path, monkeypatch, pool):
    """A GPU is timed with the spares still starting paused (SIGSTOP to their process group) and none spawned; a
    spare already waiting for its job is left alone; all go on when the last timing of the device ends."""

    def spare(name: str, ready: bool) -> spares.Spare:
        tmp = tmp_path / name
        (tmp / "scratch").mkdir(parents=True)
        if ready:
            (tmp / "scratch" / spares.READY).write_text("{}")
        # a group of two processes, as a launcher and its child
        proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                 "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                                 "time.sleep(60)"], start_new_session=True)
        pool.procs.append(proc)
        return spares.Spare(tmp, proc, ("m", "cuda:0", "candidate", "{}"), {}, tmp, None, time.monotonic())

    starting, waiting = spare("starting", False), spare("waiting", True)
    pool.ready[("cuda:0", "candidate")] = [starting, waiting]
    spawned = []
    monkeypatch.setattr(spares, "_spawn_spare", lambda *a: spawned.append(time.monotonic()) or waiting)
    monkeypatch.setenv(spares.PRESTART_ENV, "3")  # two kept: one more to start
    time.sleep(0.3)  # both groups up
    with pool.quiet("cuda:0") as q:
        assert q["s"] < 2.0 and spares._groups_stopped({starting.proc.pid})
        assert _state(waiting.proc.pid) != "T"
        with pool.quiet("cuda:0"):  # a second timing of the device, ending first: nothing goes on yet
            pool.prime("m", "cuda:0", {}, "candidate")
        assert _state(starting.proc.pid) == "T"
        time.sleep(0.3)
        assert not spawned  # the spawn waits for the timing's end
        t_end = time.monotonic()
    deadline = time.monotonic() + 5
    while _state(starting.proc.pid) == "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(starting.proc.pid) != "T"
    while not spawned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spawned and spawned[0] >= t_end
    # TIK_SPARE_SETTLE=0: nothing paused
    monkeypatch.setenv(spares.SETTLE_ENV, "0")
    with pool.quiet("cuda:0"):
        assert _state(starting.proc.pid) != "T"


def test_quiet_holds_a_spare_still_importing_at_its_gate_and_pauses_one_past_it(tmp_path, pool):
    """A spare still importing (CPU only) is not paused by a timing: it goes on, and waits at its gate before its
    device (`child.device_gate`) until the timing ends; one already past its gate is paused (SIGSTOP)."""

    def spare(name: str, at_device: bool) -> spares.Spare:
        tmp = tmp_path / name
        (tmp / "scratch").mkdir(parents=True)
        (tmp / "impl").mkdir()
        if at_device:
            (tmp / "scratch" / spares.AT_DEVICE).write_text("")
        # imports stand-in: wait for "go", then the gate, then "passed"
        code = ("import sys, time; from pathlib import Path; from tik_kernels.evaluator.child import device_gate; "
                "t = Path(sys.argv[1])\n"
                "while not (t / 'go').exists(): time.sleep(0.01)\n"
                "device_gate(t / 'scratch' / sys.argv[2], t / 'impl' / sys.argv[3], 30.0)\n"
                "(t / 'passed').write_text(''); time.sleep(60)")
        proc = subprocess.Popen([sys.executable, "-c", code, str(tmp), spares.AT_DEVICE, spares.HOLD],
                                start_new_session=True)
        pool.procs.append(proc)
        return spares.Spare(tmp, proc, ("m", "cuda:0", "candidate", "{}"), {}, tmp, None, time.monotonic())

    importing, past = spare("importing", False), spare("past", True)
    pool.ready[("cuda:0", "candidate")] = [importing, past]

    def wait_for(cond, limit=20.0):
        deadline = time.monotonic() + limit
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.01)
        return cond()

    with pool.quiet("cuda:0"):
        assert wait_for(lambda: spares._groups_stopped({past.proc.pid}), 2.0)
        assert _state(importing.proc.pid) != "T" and (importing.tmp / "impl" / spares.HOLD).exists()
        (importing.tmp / "go").write_text("")  # its imports end within the timing: it stops at its gate
        assert wait_for(lambda: (importing.tmp / "scratch" / spares.AT_DEVICE).exists())
        time.sleep(0.3)
        assert not (importing.tmp / "passed").exists() and _state(importing.proc.pid) != "T"
    assert not (importing.tmp / "impl" / spares.HOLD).exists()
    assert wait_for(lambda: (importing.tmp / "passed").exists())
    assert wait_for(lambda: _state(past.proc.pid) != "T", 5.0)


def test_a_gpu_keeps_two_spares_by_default_the_cpu_one(monkeypatch):
    monkeypatch.delenv(spares.PRESTART_ENV, raising=False)
    assert spares.prestart_depth("cuda:0") == 2 and spares.prestart_depth("cpu") == 1 and spares.prestart_depth() == 1
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    assert spares.prestart_depth("cuda:0") == 0
