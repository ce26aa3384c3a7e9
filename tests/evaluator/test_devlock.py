"""The device lock several TIK processes on one GPU share (tik_kernels/evaluator/devlock.py).

flock conflicts between open files, not processes: two `DeviceLock`s on one path here stand for two processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tik_kernels.evaluator import devlock
from tik_kernels.evaluator.devlock import DeviceLock


def _later(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def test_a_timing_waits_for_another_process_shared_hold_and_the_reverse(tmp_path):
    path = tmp_path / "GPU-x.lock"
    a, b = DeviceLock(path), DeviceLock(path)
    events, done = [], threading.Event()

    def timing():
        events.append("b in")
        with b.exclusive():
            events.append("b has it")
            done.wait(5)

    with a.shared():
        t = _later(timing)
        time.sleep(0.3)
        assert events == ["b in"]  # B waits while A's evaluation holds the device
        events.append("a out")
    deadline = time.monotonic() + 5
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events == ["b in", "a out", "b has it"]
    # B holds it exclusive: a shared hold waits for B's timing
    c = DeviceLock(path, wait_s=0.3)
    with c.shared() as got:
        assert got["gave_up"] and got["wait_s"] >= 0.3
    done.set()
    t.join(5)


def test_a_queued_timing_is_not_starved_by_new_shared_holders(tmp_path):
    path = tmp_path / "GPU-x.lock"
    a, b, c = DeviceLock(path), DeviceLock(path), DeviceLock(path)
    order = []

    def timing():
        with b.exclusive():
            order.append("timing")
            time.sleep(0.1)

    def evaluation():
        with c.shared():
            order.append("evaluation")

    with a.shared():
        tb = _later(timing)
        time.sleep(0.2)  # B has queued (holds the turnstile)
        tc = _later(evaluation)
        time.sleep(0.2)
        assert order == []  # C waits behind B, not beside A
    tb.join(5)
    tc.join(5)
    assert order == ["timing", "evaluation"]


def test_two_shared_holders_that_both_ask_for_the_timing_lock_do_not_deadlock(tmp_path):
    path = tmp_path / "GPU-x.lock"
    locks = [DeviceLock(path, wait_s=10), DeviceLock(path, wait_s=10)]
    got, inside = [], []
    start = threading.Barrier(2)

    def process(lock):
        with lock.shared():
            start.wait()
            with lock.exclusive() as g:
                inside.append(1)
                assert len(inside) == 1  # alone at the device
                time.sleep(0.05)
                inside.pop()
                got.append(g["gave_up"])

    ts = [_later(process, lk) for lk in locks]
    for t in ts:
        t.join(15)
    assert got == [False, False]


def test_one_process_holders_never_wait_for_each_other(tmp_path):
    path = tmp_path / "GPU-x.lock"
    a = DeviceLock(path, wait_s=0.2)
    with a.shared(), a.exclusive() as ex:
        assert not ex["gave_up"] and ex["wait_s"] < 0.2
        with a.shared() as sh, a.exclusive() as ex2:
            assert not sh["gave_up"] and not ex2["gave_up"]
    # back to shared after the timing: another process's timing still waits for the shared hold
    other = DeviceLock(path, wait_s=0.2)
    with a.shared():
        with a.exclusive():
            pass
        with other.exclusive() as g:
            assert g["gave_up"]
    with other.exclusive() as g:
        assert not g["gave_up"]


def test_threads_of_one_process_take_turns_at_the_timing_lock(tmp_path):
    a = DeviceLock(tmp_path / "GPU-x.lock")
    inside, most = [], []

    def timing():
        with a.exclusive():
            inside.append(1)
            most.append(len(inside))
            time.sleep(0.05)
            inside.pop()

    ts = [_later(timing) for _ in range(3)]
    for t in ts:
        t.join(5)
    assert most == [1, 1, 1]


def test_a_holder_that_never_lets_go_delays_a_timing_but_does_not_stop_it(tmp_path):
    path = tmp_path / "GPU-x.lock"
    stuck = DeviceLock(path)
    timing = DeviceLock(path, wait_s=0.25)
    with stuck.exclusive():
        t0 = time.monotonic()
        with timing.exclusive() as g:
            assert g["gave_up"] and 0.25 <= g["wait_s"] < 2
        assert time.monotonic() - t0 < 2


def test_another_process_is_excluded_and_no_child_inherits_the_lock(tmp_path):
    """A real second process: it cannot take the lock exclusive while this one holds it shared; the descriptors are
    close-on-exec (a candidate child never holds, or outlives this process with, the lock)."""
    path = tmp_path / "GPU-x.lock"
    a = DeviceLock(path)
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    with a.shared():
        out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "held"
        for fd in a.fds.values():
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "free"


def test_for_device_only_on_a_gpu_and_unless_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(devlock.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(devlock, "gpu_key", lambda device: "GPU-1234")
    monkeypatch.setattr(devlock, "_KEYS", {})
    assert devlock.for_device("cpu") is None
    lock = devlock.for_device("cuda:0")
    assert lock is not None and lock.path == tmp_path / "GPU-1234.lock"
    assert devlock.for_device("cuda:0") is lock  # one per process and GPU
    with devlock.shared("cpu") as g:
        assert g == {"wait_s": 0.0, "gave_up": False}
    monkeypatch.setenv(devlock.ENV, "0")
    assert devlock.for_device("cuda:0") is None


def test_gpu_key_is_a_file_name_without_a_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ab/cd,1")
    key = devlock.gpu_key("cuda:0")
    assert "/" not in key and key  # no NVML, no CUDA here: the visible entry, made a file name


def test_the_timing_block_waits_for_another_processes_evaluation(tmp_path, monkeypatch):
    """core._quiet on a GPU device: the report gets the wait (`device_wait`), after another process's shared hold."""
    from tik_kernels.evaluator import core
    from tik_kernels.evaluator.report import EvalReport

    monkeypatch.setenv(devlock.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(devlock, "gpu_key", lambda device: "GPU-1234")
    monkeypatch.setattr(devlock, "_KEYS", {})
    monkeypatch.setattr(devlock, "_LOCKS", {})
    other = DeviceLock(tmp_path / "GPU-1234.lock")
    report = EvalReport(op="rmsnorm", verified=False, failure=None)
    hold = other.shared()
    hold.__enter__()
    threading.Timer(0.3, lambda: hold.__exit__(None, None, None)).start()
    with core._quiet("cuda:0", report):
        pass
    assert report.phases["device_wait"] >= 0.25 and "device_wait_gave_up" not in report.phases


def test_a_starting_spare_holds_the_device_until_it_is_ready(tmp_path):
    from tik_kernels.evaluator import spares

    class Proc:
        def poll(self):
            return None

    spare = spares.Spare(tmp=tmp_path, proc=Proc(), key=(), spec={}, cache_dir=tmp_path, own_cache=None,
                         born=time.monotonic())
    (tmp_path / "scratch").mkdir()
    path = tmp_path / "GPU-x.lock"
    mine, other = DeviceLock(path), DeviceLock(path, wait_s=0.2)
    hold = mine.shared()
    hold.__enter__()
    t = _later(spares._hold_until_ready, spare, hold)
    with other.exclusive() as g:
        assert g["gave_up"]  # still starting: another process's timing waits
    (tmp_path / "scratch" / spares.READY).write_text("")
    t.join(5)
    with other.exclusive() as g:
        assert not g["gave_up"]


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX")
def test_the_lock_files_are_shared_by_any_user(tmp_path):
    lock = DeviceLock(tmp_path / "locks" / "GPU-x.lock")
    with lock.shared():
        pass
    assert (tmp_path / "locks" / "GPU-x.lock").stat().st_mode & 0o666 == 0o666
    assert Path(tmp_path / "locks").stat().st_mode & 0o1777 == 0o1777


def test_no_lock_can_be_made_then_it_goes_on_without_one(tmp_path):
    """A lock directory that cannot be made (a file in its place, as a read-only /tmp would refuse it): every block
    goes on at once, marked as without the lock, and nothing raises."""
    (tmp_path / "taken").write_text("a file, not a directory")
    lock = DeviceLock(tmp_path / "taken" / "GPU-x.lock")
    with lock.shared() as sh, lock.exclusive() as ex:
        assert sh["gave_up"] and ex["gave_up"]
    with lock.exclusive() as ex:
        assert ex["gave_up"] and ex["wait_s"] < 1
