"""One child per timed evaluation (spawn.PhasedChild): the candidate's probes, the parent's checks, then the
same child times candidate, root and incumbent, or is stopped. Spawns are counted; a child that fails a check,
hangs while waiting or while timing, or lies in its first reply is a one-line failure and is gone when
`evaluate` returns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from evaluator_fixtures import FIX, tiny

from tik_kernels.evaluator import evaluate, measure, spares, spawn
from tik_kernels.evaluator.core import warm_root

ROOT = FIX / "tiny_root.py"
CORRECT = "def scale(x, w):\n    return (x.float() * w.float()).to(x.dtype)\n"
#: stops its own process (SIGSTOP: it can neither work nor exit) once the parent has decided (or, for STOP_EARLY,
#: once the child has replied): a child hanging between its two jobs
HANG_AFTER_REPLY = '''
import json as _json, os as _os, signal as _signal, threading as _threading, time as _time

_tmp = _os.environ["TMPDIR"]
_next = _json.load(open(_os.path.join(_tmp, "job.json")))["next"]


def _freeze():
    while not (_os.path.exists(_next) or (STOP_EARLY and _os.path.exists(_os.path.join(_tmp, "out", "result.json")))):
        _time.sleep(0.0005)
    _os.kill(_os.getpid(), _signal.SIGSTOP)


_threading.Thread(target=_freeze, daemon=True).start()
'''


@pytest.fixture(scope="module", autouse=True)
def _root_warm():
    """The root's probes once, so an evaluation here starts the candidate's child and nothing else."""
    warm_root(tiny(), device="cpu", timeout=60, root_path=ROOT)


@pytest.fixture
def spawned(monkeypatch):
    """Every child started (job mode, Popen), in order; no spare (`test_prestart.py` tests those), so each
    evaluation starts its candidate's child (a spare started late can match the next test's world and serve it)."""
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    seen: list[tuple[str, object]] = []
    launch = spawn._launch

    def counting(tmp, mode, job, write_inputs, cache, then=None):
        # a child starting while an earlier candidate child still runs: recorded, the GPU test forbids it
        alive = [m for m, p in seen if m == "probes+time" and p.poll() is None]
        proc = launch(tmp, mode, job, write_inputs, cache, then=then)
        seen.append((job["mode"] + ("+time" if then is not None else "") + ("+alongside" if alive else ""), proc))
        return proc

    monkeypatch.setattr(spawn, "_launch", counting)  # where run_child and PhasedChild read it
    return seen


def run(path: Path, **kw):
    kw.setdefault("timeout", 30)
    return evaluate(tiny(), path, root_path=ROOT, device="cpu", time_it=True, **kw)


def test_a_timed_evaluation_starts_one_candidate_child(spawned):
    rep = run(FIX / "good.py")
    assert rep.verified, rep.failure
    assert [m for m, _ in spawned] == ["probes+time"]
    assert [c["cell"] for c in rep.as_dict()["cells"]] == ["tiny[T=8]", "tiny[T=32]"]
    assert all(c.passed for c in rep.checks) and any(c.name == "timing/outputs" for c in rep.checks)
    assert spawned[0][1].poll() is not None


def test_a_candidate_that_fails_a_check_is_never_timed_and_its_child_is_gone(spawned):
    rep = run(FIX / "zeros.py")
    assert not rep.verified and rep.failure.startswith("tiny/accuracy"), rep.failure
    assert not rep.cells and "timing_child" not in rep.phases
    assert [m for m, _ in spawned] == ["probes+time"] and spawned[0][1].poll() is not None


def test_a_child_that_ignores_stop_is_killed(spawned, tmp_path):
    path = tmp_path / "wrong_frozen.py"
    path.write_text(HANG_AFTER_REPLY.replace("STOP_EARLY", "True") + "\n\ndef scale(x, w):\n    return x * 0\n")
    t0 = time.monotonic()
    rep = run(path)
    assert not rep.verified and rep.failure.startswith("tiny/accuracy"), rep.failure
    assert time.monotonic() - t0 < 15 and spawned[0][1].poll() is not None


@pytest.mark.parametrize("when", ["waiting", "timing"])
def test_a_child_that_hangs_after_its_probes_is_killed_with_a_reason(spawned, tmp_path, monkeypatch, when):
    monkeypatch.setattr(measure, "timing_wall", lambda timeout, n_cells, cuda: 3.0)
    path = tmp_path / f"hangs_{when}.py"
    if when == "waiting":
        path.write_text(HANG_AFTER_REPLY.replace("STOP_EARLY", "False") + "\n\n" + CORRECT)
    else:  # T=32 is timed, never probed
        path.write_text("def scale(x, w):\n    while x.shape[0] == 32:\n        pass\n"
                        "    return (x.float() * w.float()).to(x.dtype)\n")
    t0 = time.monotonic()
    rep = run(path)
    assert rep.failure == "timing run: timed out after 3 s (killed)", rep.failure
    assert not rep.verified and not rep.cells
    assert all(c.passed for c in rep.checks if not c.name.startswith("timing/"))
    assert time.monotonic() - t0 < 25 and spawned[0][1].poll() is not None


def test_a_malformed_first_reply_is_a_protocol_error(spawned, tmp_path):
    path = tmp_path / "lies.py"
    # written whole, then renamed into place (as the real child does): the reply is well-formed JSON that lies;
    # json.dump straight into result.json let the parent read it half written now and then (another protocol error)
    path.write_text("import json, os, time\n"
                    "out = os.path.join(os.environ['TMPDIR'], 'out')\n"
                    "with open(os.path.join(out, 'result.tmp'), 'w') as f:\n"
                    "    json.dump({'done': True, 'import_error': None, 'probes': 'all fine', 'tensors': []}, f)\n"
                    "os.replace(os.path.join(out, 'result.tmp'), os.path.join(out, 'result.json'))\n"
                    "time.sleep(600)\n" + CORRECT)
    t0 = time.monotonic()
    rep = run(path)
    assert rep.failure == "protocol error: probe results do not match the probes sent", rep.failure
    assert not rep.verified and not rep.cells
    assert time.monotonic() - t0 < 20 and spawned[0][1].poll() is not None


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_on_the_gpu_the_candidate_has_one_child_and_it_is_gone_before_the_control_run(spawned, monkeypatch):
    monkeypatch.setattr(measure, "_CONTROL_CACHE", {})  # a control run of its own, not one an earlier test kept
    rep = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cuda", time_it=True, timeout=120)
    assert rep.verified, rep.failure
    modes = [m for m, _ in spawned]
    assert modes.count("probes+time") == 1 and modes[-1] == "time", modes  # the control child comes last
    assert not any(m.endswith("+alongside") for m in modes), modes
    assert rep.as_dict()["cells"] and any(c.name == "timing/integrity" and c.passed for c in rep.checks)


@pytest.fixture
def overlapped(monkeypatch):
    """The GPU's order on the CPU: the child is told to time as soon as its probes are back, while the parent checks
    them (`core.OVERLAP_CHECKS`)."""
    from tik_kernels.evaluator import core

    monkeypatch.setattr(core, "OVERLAP_CHECKS", True)


def test_checks_overlapped_with_the_timing_judge_the_same(spawned, overlapped):
    rep = run(FIX / "good.py")
    assert rep.verified, rep.failure
    assert rep.phases.get("checks_overlapped") == 1.0 and rep.phases["timing_child"] > 0
    assert [m for m, _ in spawned] == ["probes+time"] and spawned[0][1].poll() is not None
    assert [c["cell"] for c in rep.as_dict()["cells"]] == ["tiny[T=8]", "tiny[T=32]"]
    assert all(c.passed for c in rep.checks) and any(c.name == "timing/outputs" for c in rep.checks)


def test_an_overlapped_timing_that_hangs_is_killed_with_a_reason(spawned, overlapped, tmp_path, monkeypatch):
    """Right outputs (every check passes) and a timing that never ends: the timing's own limit kills it."""
    monkeypatch.setattr(measure, "timing_wall", lambda timeout, n_cells, cuda: 3.0)
    path = tmp_path / "hangs_timing.py"
    path.write_text("def scale(x, w):\n    while x.shape[0] == 32:\n        pass\n"
                    "    return (x.float() * w.float()).to(x.dtype)\n")
    t0 = time.monotonic()
    rep = run(path)
    assert rep.failure == "timing run: timed out after 3 s (killed)", rep.failure
    assert not rep.verified and not rep.cells and rep.phases.get("checks_overlapped") == 1.0
    assert all(c.passed for c in rep.checks if not c.name.startswith("timing/"))
    assert time.monotonic() - t0 < 25 and spawned[0][1].poll() is not None


def test_a_failed_check_stops_the_overlapped_timing(spawned, overlapped, tmp_path, monkeypatch):
    """Wrong outputs, and a timing that would never end (T=32 is timed, never probed): the failed check kills the
    child at once, the report is the check's failure and nothing timed is judged."""
    monkeypatch.setattr(measure, "timing_wall", lambda timeout, n_cells, cuda: 60.0)
    path = tmp_path / "wrong_and_hangs.py"
    path.write_text("def scale(x, w):\n    while x.shape[0] == 32:\n        pass\n    return x * 0\n")
    t0 = time.monotonic()
    rep = run(path)
    assert not rep.verified and rep.failure.startswith("tiny/accuracy"), rep.failure
    assert not rep.cells and "timing_child" not in rep.phases and rep.phases.get("checks_overlapped") == 1.0
    assert time.monotonic() - t0 < 20 and spawned[0][1].poll() is not None
