"""Running a job in a child: `run_child` (one job) and `PhasedChild` (one child, two jobs, the parent deciding in
between: a candidate's probes, then its timing). The job's files are staged where the child reads them and cannot
write them (`_launch` for a child started now, `_hand_over` for a pre-started one taken from `spares.py`), a hard
timeout kills the child's whole process group, and the reply is read back through `protocol` (`_read_reply`: plain
files only, else a one-line failure), with where the parent's time went (`ChildOutcome.phases`).

A timed evaluation's candidate child is usually pre-started (`spares.Spares`): the same child in the same jail,
started while the previous candidate was evaluated, waiting for its first job; it serves one candidate. This module
is the top of the sandbox's modules: the jail (`sandbox.py`), the fork servers (`servers.py`) and the spares lie
below it, and none of them imports it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the module, not the name: `spares.SPARES` is looked up at each call, so one binding serves every reader (a test
# that replaces it replaces it here too)
from tik_kernels.evaluator import spares
from tik_kernels.evaluator.forkserver import Forked
from tik_kernels.evaluator.protocol import ProtocolError, read_json
from tik_kernels.evaluator.sandbox import (
    JAIL_IMPL,
    POLL_S,
    SETUP_FAILED,
    _dumps,
    _kill,
    _stage,
    isolation,
    triton_cache,
)
from tik_kernels.evaluator.servers import _child_tempdir, _start, forks
from tik_kernels.evaluator.spares import START, prestart_depth

#: the parent's next step for a `PhasedChild`, in its implementation directory: read-only to the child, so the
#: candidate can neither forge the parent's decision nor make the parent write through a link of its own
NEXT = "next.json"


@dataclass
class ChildOutcome:
    doc: dict | None
    failure: str | None
    elapsed_s: float
    #: where the parent's time went (seconds): "start" (a spare taken or a child launched, its job staged),
    #: "inputs" (write_inputs), "wait" (until the reply was there), "read" (the reply read and validated); and
    #: "forked", a count: 1.0 when the fork server forked the child, 0.0 when the launcher started it
    phases: dict = field(default_factory=dict)


class _Stopwatch:
    """The parent's phases of one child (`ChildOutcome.phases`): `lap(name)` adds the seconds since the last lap;
    `inputs(write_inputs)` wraps the job's writer so its seconds count as "inputs", not as the lap around it."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now

    def inputs(self, write_inputs: Callable[[Path], dict]) -> Callable[[Path], dict]:
        def timed(d: Path) -> dict:
            t = time.monotonic()
            try:
                return write_inputs(d)
            finally:
                self.phases["inputs"] = self.phases.get("inputs", 0.0) + time.monotonic() - t
                self.t += time.monotonic() - t  # not counted again in the enclosing lap
        return timed

    def outcome(self, o: ChildOutcome, name: str) -> ChildOutcome:
        self.lap(name)
        o.phases = self.phases
        return o


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()[-n:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _last_error_line(stderr: str) -> str:
    """The error line of the child's last traceback, with where it was raised (file:line in function)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln) or "Fatal Python error" in ln:
            frames = (re.match(r'^File "([^"]+)", line (\d+), in (\S+)', x) for x in reversed(lines[:i]))
            where = next((m for m in frames if m), None)
            at = f" (at {Path(where[1]).name}:{where[2]} in {where[3]})" if where else ""
            return (ln[:200] + at)[:300]
    return lines[-1][:200] if lines else ""


def run_child(job: dict, write_inputs: Callable[[Path], dict], read_result: Callable[[Path, dict], Any],
              timeout: float, cache: str = "private", trusted: bool = False) -> ChildOutcome:
    """Run one job in a child. `write_inputs(dir)` adds the job's data files and returns extra job
    fields; `read_result(out_dir, doc)` turns the child's reply into trusted values (may raise
    ProtocolError); `cache` is the child's Triton cache (`sandbox.triton_cache`). `trusted`: the job runs only the
    library's own code (it may run without the jail where the jail does not start). The job's "impl",
    "impls" and "contract_file" paths are copied for the child. The scratch directory is removed before this
    returns. (`PhasedChild`: one child, two jobs, with the parent's decision between them.)

    A candidate's probes job with a private cache (not `trusted`: an untimed CPU evaluation's, which is nothing
    else) runs in a pre-started child when one is ready (`spares.Spares`), as the first phase of a `PhasedChild` with no
    second: the same jail, limits, checks and reply, without the child's start (Python, torch, Triton: ~1.2 s of
    CPU) on the evaluation's critical path."""
    if job.get("mode") == "probes" and not trusted and cache == "private" and prestart_depth():
        with PhasedChild(job, write_inputs, None, cache=cache) as child:
            return child.first(read_result, timeout)
    t0 = time.monotonic()
    mode, refused = isolation(trusted)
    if refused:
        return ChildOutcome(None, refused, 0.0)
    tmp = _child_tempdir("tik-eval-", mode, job["device"], cache)
    proc = None
    clock = _Stopwatch()
    try:
        proc = _launch(tmp, mode, job, clock.inputs(write_inputs), cache)
        clock.lap("start")
        clock.phases["forked"] = float(isinstance(proc, Forked))
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0, clock.phases)
        # reap anything the candidate left running in its session
        _kill(proc)
        clock.lap("wait")
        failure = _exit_failure(rc, tmp)
        if failure:
            return ChildOutcome(None, failure, time.monotonic() - t0, clock.phases)
        return clock.outcome(_read_reply(tmp / "scratch" / "out", read_result, t0), "read")
    finally:
        if proc is not None and proc.poll() is None:
            _kill(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _launch(tmp: Path, mode: str | None, job: dict, write_inputs: Callable[[Path], dict], cache: str,
            then: dict | None = None) -> subprocess.Popen:
    """Stage the job (and `then`, a second job, see `PhasedChild`) under `tmp` and start the child."""
    scratch = tmp / "scratch"
    (scratch / "work").mkdir(parents=True)
    jailed = mode is not None
    inside = JAIL_IMPL if jailed else str(tmp / "impl")
    # the job's data, like a pre-started child's (`_hand_over`), where the child reads it and cannot write
    box = tmp / "impl" / "job"
    box.mkdir(parents=True)
    job = _job_files({**job, **write_inputs(box)}, box, f"{inside}/job")
    job = _stage(job, tmp / "impl", inside)
    if then is not None:
        # the second job's files are staged now (the implementation directory is mounted when the child starts);
        # the job itself reaches the child only when the parent says so (`PhasedChild.then`)
        (tmp / "impl").mkdir(exist_ok=True)
        (tmp / "then.json").write_text(_dumps(_stage(then, tmp / "impl" / "then", f"{inside}/then")))
        job["next"] = f"{inside}/{NEXT}"
    (scratch / "job.json").write_text(_dumps(job))
    return _start(tmp, mode, job["device"], cache, triton_cache(cache, scratch))[0]


def _job_files(job: dict, box: Path, inside: str) -> dict:
    """The job with the files its write_inputs left in `box` (read-only to the child) named as the child sees them:
    its inputs, and the socket its reply's shared memory goes over (`protocol.SharedOutputs`)."""
    if (box / "inputs.bin").exists():
        job["inputs"] = f"{inside}/inputs.bin"
    if (box / "reply.sock").is_socket():
        job["reply_socket"] = f"{inside}/reply.sock"
    return job


def _exit_failure(rc: int, tmp: Path) -> str | None:
    """The one-line failure of a child that exited with status `rc` (None for 0)."""
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        return f"crashed with signal {name}"
    if rc == SETUP_FAILED:
        said = [ln for ln in _tail(tmp / "stderr.txt").splitlines() if ln.startswith("tik-sandbox: ")]
        if said:
            return f"sandbox: {said[-1].removeprefix('tik-sandbox: ')}"[:300]
    if rc != 0:
        line = _last_error_line(_tail(tmp / "stderr.txt"))
        return f"exited with status {rc}" + (f": {line}" if line else "")
    return None


def _read_reply(out: Path, read_result: Callable[[Path, dict], Any], t0: float) -> ChildOutcome:
    """The child's reply in `out` (result.json + data files), through `read_result`."""
    try:
        _plain(out)
        doc = read_json(out / "result.json")
        if not isinstance(doc, dict) or doc.get("done") is not True:
            raise ProtocolError("the child's result is incomplete")
        value = read_result(out, doc)
    except ProtocolError as e:
        return ChildOutcome(None, f"protocol error: {e}", time.monotonic() - t0)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return ChildOutcome(None, f"protocol error: malformed result ({type(e).__name__}: {e})"[:300],
                            time.monotonic() - t0)
    return ChildOutcome(value, None, time.monotonic() - t0)


def _plain(out: Path) -> None:
    """The child's reply must be plain files in a plain directory: a symlink there would make this process read
    a file of its own choosing (a key, the workspace) as the child's result."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise ProtocolError("the child's output directory is not a directory")
    for p in out.iterdir():
        if p.is_symlink() or not p.is_file():
            raise ProtocolError(f"the child's output {p.name[:40]!r} is not a plain file")


class PhasedChild:
    """One child, two jobs, the parent deciding in between: the candidate's probes, then (only if the parent says
    so) its timing, in the same process, so an evaluation pays the child's start, CUDA initialisation, imports
    and kernel loading once instead of twice.

    `first` starts the child on `job` and waits (at most its timeout) for its first reply, `out/result.json`;
    the child then waits. The reply directory is moved out of the child's reach (into the parent's own directory,
    which the jail does not mount) before it is read, so the live child cannot change what is read, and it is
    read exactly as `run_child` reads a reply. `then` hands the child the second job (staged when the child
    started: `then_job`), waits for it to exit (at most its own timeout) and reads the second reply the same way;
    `stop` tells it to exit. A child that dies, hangs or lies in either phase is a one-line failure, and the
    child is killed (with anything it started) when the block ends, whatever happened."""

    def __init__(self, job: dict, write_inputs: Callable[[Path], dict], then_job: dict | None, cache: str = "private"):
        self.job, self.write_inputs, self.then_job, self.cache = job, write_inputs, then_job, cache
        self.tmp: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.exited: int | None = None
        #: whether the child was pre-started (`spares.Spares`); a pre-started child's own Triton cache outside its
        #: scratch (None once an evaluation's `sandbox.candidate_cache` has adopted it)
        self.prestarted = False
        self.own_cache: Path | None = None

    def __enter__(self) -> PhasedChild:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _kill(self.proc)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.own_cache is not None:
            shutil.rmtree(self.own_cache, ignore_errors=True)

    def first(self, read_result: Callable[[Path, dict], Any], timeout: float) -> ChildOutcome:
        t0 = time.monotonic()
        mode, refused = isolation(False)
        if refused:
            return ChildOutcome(None, refused, 0.0)
        clock = _Stopwatch()
        clock.t = t0
        # a child the fork server would fork: a spare is waited for when none is ready or starting (its start is
        # the server's, which a fresh interpreter beside it would only slow down on a loaded CPU, then a warm fork)
        spare = spares.SPARES.take(mode, self.job, self.cache, start=forks(mode, self.job["device"], self.cache)) \
            if prestart_depth() else None
        if spare is not None:
            # a child started (same jail, limits and world) before this candidate existed: it gets its first job now
            self.tmp, self.proc, self.own_cache, self.prestarted = spare.tmp, spare.proc, spare.own_cache, True
            _hand_over(self.tmp, mode, self.job, clock.inputs(self.write_inputs), self.then_job)
        else:
            self.tmp = _child_tempdir("tik-eval-", mode, self.job["device"], self.cache)
            self.proc = _launch(self.tmp, mode, self.job, clock.inputs(self.write_inputs), self.cache,
                                then=self.then_job)
        if prestart_depth():
            # the next candidate's child starts now, while this one runs
            spares.SPARES.prime(mode, self.job["device"], self.job["limits"], self.cache)
        clock.lap("start")
        clock.phases["forked"] = float(isinstance(self.proc, Forked))
        out = self.tmp / "scratch" / "out"
        while (rc := self.proc.poll()) is None and not os.path.lexists(out / "result.json"):
            if time.monotonic() - t0 > timeout:
                _kill(self.proc)
                return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0,
                                    clock.phases)
            time.sleep(POLL_S)
        if rc is not None:  # it exited without waiting for the parent: its reply is read as run_child reads one
            _kill(self.proc)
            self.exited = rc
            failure = _exit_failure(rc, self.tmp)
            if failure:
                return ChildOutcome(None, failure, time.monotonic() - t0, clock.phases)
        clock.lap("wait")
        taken = self.tmp / "reply-1"
        if os.path.lexists(out):
            try:
                os.rename(out, taken)  # a link named out is moved as a link, and refused by _plain
            except OSError as e:
                return ChildOutcome(None, f"protocol error: its reply could not be taken ({e.strerror})",
                                    time.monotonic() - t0, clock.phases)
        return clock.outcome(_read_reply(taken, read_result, t0), "read")

    def then(self, read_result: Callable[[Path, dict], Any], timeout: float,
             abort: threading.Event | None = None) -> ChildOutcome:
        """`abort`: set by another thread (the parent's checks failed while this job ran: `core.OVERLAP_CHECKS`),
        this call kills the child and returns. Only this call touches the child while it waits."""
        t0 = time.monotonic()
        assert self.proc is not None and self.tmp is not None, "then() before first()"
        rc = self.exited if self.exited is not None else self.proc.poll()
        if rc is not None:
            _kill(self.proc)
            failure = _exit_failure(rc, self.tmp)
            return ChildOutcome(None, (failure + " while waiting") if failure else
                                "exited before it was told to go on", time.monotonic() - t0)
        job = json.loads((self.tmp / "then.json").read_text())
        _write_next(self.tmp / "impl", {"job": job})
        try:
            if abort is None:
                rc = self.proc.wait(timeout=timeout)
            else:
                while (rc := self.proc.poll()) is None:
                    if abort.is_set():
                        _kill(self.proc)
                        return ChildOutcome(None, "stopped: the parent's checks failed", time.monotonic() - t0)
                    if time.monotonic() - t0 > timeout:
                        raise subprocess.TimeoutExpired("child", timeout)
                    time.sleep(POLL_S)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0)
        exited_at = time.time()
        _kill(self.proc)
        self.exited = rc
        failure = _exit_failure(rc, self.tmp)
        if failure:
            return ChildOutcome(None, failure, time.monotonic() - t0)
        out = self.tmp / "scratch" / "out"
        # diagnostics: how long the child took to exit after its reply was complete (a CUDA process's teardown),
        # from the reply's own timestamp; and the parent's reading of the reply
        try:
            phases = {"exit": max(0.0, exited_at - os.lstat(out / "result.json").st_mtime)}
        except OSError:
            phases = {}
        t_read = time.monotonic()
        outcome = _read_reply(out, read_result, t0)
        outcome.phases = {**phases, "read": time.monotonic() - t_read}
        return outcome

    def stop(self) -> None:
        """Tell a waiting child to exit, and kill it (a clean exit is a courtesy: nothing waits on it long)."""
        if self.proc is None or self.proc.poll() is not None or self.tmp is None:
            return self.close()
        _write_next(self.tmp / "impl", {"stop": True})
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        _kill(self.proc)  # what it left running in its session too
        self.close()


def _write_next(impl: Path, doc: dict, name: str = NEXT) -> None:
    """Atomically: the child never reads half a decision."""
    part = impl / f".{name}.part"
    part.write_text(_dumps(doc))
    os.replace(part, impl / name)


def _hand_over(tmp: Path, mode: str | None, job: dict, write_inputs: Callable[[Path], dict],
               then: dict | None) -> None:
    """A spare's first job (and its second, `then`, staged as `_launch` stages it): the job's files, its inputs and
    the job itself under its implementation directory, which the child reads and cannot write; START last."""
    inside = JAIL_IMPL if mode is not None else str(tmp / "impl")
    box = tmp / "impl" / "job"
    box.mkdir()
    job = _job_files({**job, **write_inputs(box)}, box, f"{inside}/job")
    job = _stage(job, box, f"{inside}/job")
    if then is not None:
        (tmp / "then.json").write_text(_dumps(_stage(then, tmp / "impl" / "then", f"{inside}/then")))
        job["next"] = f"{inside}/{NEXT}"
    _write_next(tmp / "impl", {"job": job}, START)
