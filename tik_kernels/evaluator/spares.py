"""Pre-started candidate children (`Spares`, `SPARES`): a timed evaluation's candidate child is usually started while
the previous candidate was evaluated: the same child in the same jail, waiting for its first job, so its start
(Python, torch, Triton, the harness, the CUDA context: seconds) is off its evaluation's critical path; each serves one
candidate. The same background thread starts an evaluator process's fork server early (`prepare`). A GPU is timed
within `quiet_spares`: the spares still starting are paused and none is spawned until the timing ends, so no CUDA
context is created beside it (`settle_spares`, which waits for the spares' whole start, serves the CPU's root probes).

This module starts, keeps and discards the spares; the evaluation takes one and hands it its job
(`spawn.PhasedChild`), which is why it sits below `spawn.py`, on the jail (`sandbox.py`) and the fork servers
(`servers.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# the modules, not their names: `sandbox._TRUSTED_CACHE` is bound only when the trusted cache is first made, and
# `servers.SERVERS` is looked up at each call, so one binding serves every reader (a test that replaces it replaces
# it here too)
from tik_kernels.evaluator import devlock, sandbox, servers
from tik_kernels.evaluator.sandbox import (
    _CANDIDATE_CACHE,
    JAIL_IMPL,
    POLL_S,
    _dumps,
    _give,
    _kill,
    _seeded,
    _world,
    isolation,
    owned_tempdir,
    triton_cache,
)
from tik_kernels.evaluator.servers import _child_tempdir, _start, forks

#: how many pre-started candidate children (`Spares`) the evaluator keeps ready per (device, cache mode); 0 turns
#: them off. Off suits a process that evaluates once (its spare would only compete with the evaluation for the
#: CPU, hold a CUDA context, and be killed at exit unused) and tests that count the children an evaluation starts.
PRESTART_ENV = "TIK_PRESTART"
#: a spare older than this is not used but killed, and a fresh child started: an idle child should not hold its
#: memory (a CUDA context) for ever; the child itself gives up waiting a minute later
SPARE_MAX_AGE_S = 600.0
#: at most this long an evaluation waits for a spare that is being started (`Spares.take`, `Spares.settle`)
SETTLE_S = 60.0
#: "0": evaluations time a candidate beside spares being started, without pausing them (`Spares.quiet`): an experiment
#: for a GPU
SETTLE_ENV = "TIK_SPARE_SETTLE"
#: `Spares.quiet`: how long a paused spare's GPU work already queued may take to drain, after its processes stopped
DRAIN_S = 0.02
#: the spares' pending count of a fork server being started early (`Spares.serve_early`), beside the cache modes
SERVER = "server"
#: the cache modes a spare can serve ("trusted" children run the root, never a candidate)
SPARE_CACHES = ("private", "seeded", "candidate")
#: a pre-started child's first job, written by the parent into its implementation directory (as `spawn.NEXT` is)
START = "start.json"
#: a pre-started child writes this in its scratch once started (imports done, device initialised) and removes it
#: when it takes its job: read only to wait until a starting child has gone quiet (`Spares.settle`), never to decide
READY = "ready"
#: a GPU spare's gate before its device (`child.device_gate`): the parent writes HOLD into its implementation
#: directory while the device is timed, the spare writes AT_DEVICE into its scratch once its imports are done and
#: waits there while HOLD exists (`Spares.quiet`)
HOLD = "hold"
AT_DEVICE = "at-device"


def prestart_depth(device: str | None = None) -> int:
    """Spares kept ready or starting (`TIK_PRESTART`; 0: none). By default 2 for a GPU: a GPU spare's device work
    (its CUDA context and warm-ups, after 3-4 s of imports) goes on only outside the device's timings
    (`Spares.quiet`), so with one spare every second evaluation waited 5-10 s for it on an H100
    (results/eval_rate_h100_s36_before.md); with two, and the imports beside the timings, none waited more than
    0.2 s (results/eval_rate_h100_s36_*.md). 1 elsewhere (the CPU machine's two cores: 1.61 s an evaluation with
    one, results/eval_rate_cpu_prestart1_evals8.md)."""
    v = os.environ.get(PRESTART_ENV, "").strip()
    if v.isdigit():
        return int(v)
    return 2 if device is not None and str(device).startswith("cuda") else 1


@dataclass
class Spare:
    """A candidate child started before its candidate existed, waiting for its first job (`START`)."""

    tmp: Path
    proc: subprocess.Popen
    key: tuple  # (uid mode, device, cache mode, limits)
    spec: dict  # the launcher's spec: environment, mounts, hidden paths, cwd
    cache_dir: Path
    own_cache: Path | None  # a "candidate" cache: its directory outside the scratch
    born: float
    spawn_s: float | None = None  # the parent's part of its start (`Spares._run`)

    def starting(self) -> bool:
        """Still starting: alive, and not yet READY (its start is GPU work on a GPU: `quiet`, `settle`, the device
        lock's hold)."""
        return self.proc.poll() is None and not (self.tmp / "scratch" / READY).exists()

    def hold(self) -> bool:
        """Hold this starting spare back from its device (`HOLD`); True where it may already be past its gate
        (`AT_DEVICE` there, or the hold could not be written): such a spare is paused instead."""
        try:
            (self.tmp / "impl" / HOLD).write_text("")
        except OSError:
            return True
        return (self.tmp / "scratch" / AT_DEVICE).exists()

    def release(self) -> None:
        with contextlib.suppress(OSError):
            (self.tmp / "impl" / HOLD).unlink()

    def discard(self) -> None:
        _kill(self.proc)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.own_cache is not None:
            shutil.rmtree(self.own_cache, ignore_errors=True)


class Spares:
    """The pre-started candidate children of this process: a candidate's child starts (Python, torch, Triton, the
    harness, the CUDA context: seconds) while the previous candidate is evaluated, not on its own critical path.

    A spare is the child `spawn.PhasedChild` would start, started earlier: the same launcher, jail, scrubbed
    environment, rlimits (set at its start from the limits of the evaluation that asked for it) and an empty scratch
    directory; it imports what a child imports, initialises its device, then waits, running nothing else, until the
    parent writes its first job into its read-only implementation directory. From then on it is a `PhasedChild` like any
    other (the same phases, timeouts, checks and reply). Each serves one candidate and is never reused. `take` uses
    one only if it is alive, younger than SPARE_MAX_AGE_S and its world (uid mode, device, cache mode, limits, and
    the spec a child started now would get: environment, mounts, hidden paths) is the evaluation's; any other is
    killed and its directories removed. Spares are started by one long-lived thread (a launcher dies with the thread
    that started it: PR_SET_PDEATHSIG), killed at exit (atexit), and die with this process however it ends (the
    launcher's PDEATHSIG chain); `sandbox.reap_stale` removes what a killed evaluator left (the directories are owned).

    The Triton cache: a "private" spare has its own empty cache in its scratch, as any child. A "candidate" spare
    cannot share its evaluation's cache (`sandbox.candidate_cache`), which does not exist yet: it gets a seeded copy of
    the trusted cache of its own, outside its scratch, topped up with what the trusted cache gained since when it is
    taken, and the evaluation's `candidate_cache` adopts it, so the evaluation's later candidate children share it
    and the next evaluation does not see it; an evaluation that already has a candidate cache takes no spare."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.cond = threading.Condition()
        self.ready: dict[tuple[str, str], list[Spare]] = {}
        self.pending: dict[tuple[str, str], int] = {}
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.closed = False
        #: boot_s: the seconds of each part of the taken spares' starts, summed (`boot_parts`; "spawn", the parent's
        #: part: its scratch, its seeded Triton cache, its launch); boot_n: how many spares they sum over
        self.stats = {"started": 0, "taken": 0, "discarded": 0, "failed": 0, "boot_s": {}, "boot_n": 0}
        #: `quiet`: per device, how many timings are in progress, how many spares are being spawned, and the spares
        #: paused until the last timing ends
        self.quiet_n: dict[str, int] = {}
        self.spawning: dict[str, int] = {}
        self.paused: dict[str, list[Spare]] = {}

    def _mine(self) -> None:
        """A forked copy of this process starts with none (its parent's spares are not its children), and with a
        lock of its own (the parent's may have been held by another thread when it forked). Called first, unlocked."""
        if self.owner != os.getpid():
            self.__init__()

    def take(self, mode: str | None, job: dict, cache: str, start: bool = False) -> Spare | None:
        """A spare fit for this child, now in the caller's hands, or None (then start one the usual way). `start`:
        when none fits and none is starting, start one (`prime`) and wait for it (`forks`: where that costs no more
        than starting the child the usual way)."""
        if cache not in SPARE_CACHES:
            return None
        holder = _CANDIDATE_CACHE.get() if cache == "candidate" else None
        if holder:  # this evaluation already has its candidate cache: a spare's would be another
            return None
        slot, key = (job["device"], cache), (mode, job["device"], cache, _dumps(job["limits"]))
        deadline = time.monotonic() + SETTLE_S
        self._mine()
        for attempt in (0, 1):
            with self.cond:
                while self.pending.get(slot) and time.monotonic() < deadline:
                    self.cond.wait(0.05)  # one being started: it is nearly ready, a fresh child is not
                spares = self.ready.pop(slot, [])
            chosen, keep, drop = None, [], []
            for s in spares:
                if not self._fits(s, mode, key):
                    drop.append(s)
                elif chosen is None:
                    chosen = s
                else:
                    keep.append(s)
            with self.cond:
                self.ready.setdefault(slot, [])[:0] = keep
                self.stats["discarded"] += len(drop)
                self.stats["taken"] += chosen is not None
            for s in drop:
                s.discard()
            if chosen is not None or not start or attempt:
                break
            self.prime(mode, job["device"], job["limits"], cache)
        if chosen is not None:
            parts = boot_parts(chosen)
            with self.cond:
                self.stats["boot_n"] += bool(parts)
                for k, v in parts.items():
                    self.stats["boot_s"][k] = round(self.stats["boot_s"].get(k, 0.0) + v, 4)
        if chosen is not None and cache != "private":
            _top_up(chosen.cache_dir, mode)
        if chosen is not None and holder is not None and chosen.own_cache is not None:
            holder.append(chosen.own_cache)  # the evaluation's candidate cache from now on (removed with it)
            chosen.own_cache = None
        return chosen

    @staticmethod
    def _fits(s: Spare, mode: str | None, key: tuple) -> bool:
        if s.proc.poll() is not None or time.monotonic() - s.born >= SPARE_MAX_AGE_S or s.key != key:
            return False
        return _world(s.tmp, mode, key[1], key[2], s.cache_dir)[1] == s.spec

    def prime(self, mode: str | None, device: str, limits: dict, cache: str) -> None:
        """Start spares in the background until prestart_depth() fit for such a child are ready or starting."""
        if cache not in SPARE_CACHES:
            return
        slot, key = (device, cache), (mode, device, cache, _dumps(limits))
        self._mine()
        with self.cond:
            if self.closed:
                return
            spares = self.ready.pop(slot, [])
            self.ready[slot] = [s for s in spares if s.key == key]
            drop = [s for s in spares if s.key != key]
            want = prestart_depth(device) - len(self.ready[slot]) - self.pending.get(slot, 0)
            self.stats["discarded"] += len(drop)
            if want > 0:
                self.pending[slot] = self.pending.get(slot, 0) + want
                self._thread()
        for s in drop:
            s.discard()
        for _ in range(max(0, want)):
            self.queue.put((mode, device, limits, cache))

    def serve_early(self, mode: str, device: str) -> None:
        """Start the fork server for `device`'s children in the background now (`prepare`), unless it is up."""
        self._mine()
        with self.cond:
            if self.closed:
                return
            self.pending[(device, SERVER)] = self.pending.get((device, SERVER), 0) + 1  # `settle` waits for it too
            self._thread()
        self.queue.put((mode, device, None, None))

    def _thread(self) -> None:
        """The spares' thread, started once (called with the lock held)."""
        if self.thread is None:
            import atexit

            self.thread = threading.Thread(target=self._run, name="tik-spares", daemon=True)
            self.thread.start()
            atexit.register(self.close)

    def _run(self) -> None:
        while (req := self.queue.get()) is not None:
            mode, device, limits, cache = req
            if limits is None:  # `serve_early`: the fork server only
                try:
                    if not self.closed:
                        servers.SERVERS.ensure(mode, device, "private")
                except Exception:  # a head start only: this thread must live on for the spares
                    self.stats["failed"] += 1
                with self.cond:
                    self.pending[(device, SERVER)] -= 1
                    self.cond.notify_all()
                continue
            spare = None
            with self.cond:  # no child starts while its device is timed (`quiet`): it waits for the timing's end
                while self.quiet_n.get(device) and not self.closed:
                    self.cond.wait(0.1)
                self.spawning[device] = self.spawning.get(device, 0) + 1
            # nor while another TIK process times it; and that process's timing waits until this one has started
            lock = devlock.for_device(device)
            hold = lock.shared() if lock is not None else None
            if hold is not None:
                hold.__enter__()
            if not self.closed:
                try:
                    t = time.monotonic()
                    spare = _spawn_spare(mode, device, limits, cache)
                    spare.spawn_s = time.monotonic() - t
                except Exception:  # it only costs the speed-up: the next evaluation starts its own child
                    self.stats["failed"] += 1
            if hold is not None and spare is None:
                hold.__exit__(None, None, None)
            elif hold is not None:
                threading.Thread(target=_hold_until_ready, args=(spare, hold), name="tik-spare-start",
                                 daemon=True).start()
            with self.cond:
                self.spawning[device] -= 1
                self.pending[(device, cache)] -= 1
                if spare is not None and not self.closed:
                    self.ready.setdefault((device, cache), []).append(spare)
                    self.stats["started"] += 1
                    spare = None
                self.cond.notify_all()
            if spare is not None:
                spare.discard()

    @contextlib.contextmanager
    def quiet(self, device: str, limit_s: float = SETTLE_S) -> Iterator[dict]:
        """A GPU timed with no spare starting beside it, without waiting for the spares to finish starting: within
        this block, no spare of `device` touches it. One still importing (the interpreter, torch, Triton: CPU only,
        ~4 s of a GPU spare's start on an H100) goes on, and waits at its gate before its device (`HOLD`,
        `child.device_gate`); one past its gate is paused (SIGSTOP to its process group: no CPU, no new GPU work; a
        stopped process holds no kernel lock, it stops on its way back to user space). No new one is spawned. When the
        last such block of the device ends, they go on (the hold removed, SIGCONT). Before pausing, a
        spawn in progress (the parent's part: a scratch, a Triton cache copied, the launch) is let finish; after,
        GPU work they had queued is given `DRAIN_S` to end. Yields {"s": the seconds that took} (the evaluation's
        `spare_settle`). A spare waiting for its job (READY) does nothing and is left alone. `settle` waited for
        the spares' whole start instead: 3.3-6.6 s of every evaluation on an H100 (session 34,
        results/eval_rate_h100_s34.md); a start paused here goes on while the next candidate's probes run.
        `TIK_SPARE_SETTLE=0`: neither pause nor wait."""
        out = {"s": 0.0}
        if os.environ.get(SETTLE_ENV, "").strip() == "0":
            yield out
            return
        t0 = time.monotonic()
        self._mine()
        with self.cond:
            self.quiet_n[device] = self.quiet_n.get(device, 0) + 1
            while self.spawning.get(device) and time.monotonic() - t0 < limit_s:
                self.cond.wait(0.02)
            starting = [sp for (d, _), v in self.ready.items() if d == device for sp in v if sp.starting()]
            paused = self.paused.setdefault(device, [])
            held = {id(sp) for sp in paused}
            starting = [sp for sp in starting if id(sp) not in held]
            paused.extend(starting)
        try:
            # a spare still importing is held at its gate (`child.device_gate`) and goes on with its CPU work; one
            # already at its device is paused
            stop = [sp for sp in starting if sp.hold()]
            for sp in stop:
                _signal_group(sp.proc.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 1.0
            while stop and not _groups_stopped({sp.proc.pid for sp in stop}) and time.monotonic() < deadline:
                time.sleep(0.002)
            if stop:
                time.sleep(DRAIN_S)
            out["s"] = time.monotonic() - t0
            yield out
        finally:
            with self.cond:
                self.quiet_n[device] -= 1
                resume = self.paused.pop(device, []) if not self.quiet_n[device] else []
                self.cond.notify_all()
            for sp in resume:
                sp.release()
                _signal_group(sp.proc.pid, signal.SIGCONT)

    def settle(self, device: str, limit_s: float = SETTLE_S) -> float:
        """Wait (at most `limit_s`) until no spare for `device` is starting: a GPU is timed without a CUDA context
        being created beside it. The seconds waited. A GPU's timings use `quiet` instead, which pauses them; this
        serves the CPU's root probes (`core._root_ahead`), which wait for the fork server and the candidate's spare."""
        t0 = time.monotonic()
        self._mine()
        while time.monotonic() - t0 < limit_s:
            with self.cond:
                busy = any(n for (d, _), n in self.pending.items() if d == device) or any(
                    s.starting() for (d, _), v in self.ready.items() if d == device for s in v)
            if not busy:
                break
            time.sleep(POLL_S)
        return time.monotonic() - t0

    def pids(self) -> list[int]:
        """The launcher pids of the spares ready now (for tests and benchmarks)."""
        with self.cond:
            return [s.proc.pid for v in self.ready.values() for s in v]

    def close(self) -> None:
        """Kill every spare and remove its directories (atexit); spares being started are discarded when they are."""
        if self.owner != os.getpid():
            return
        with self.cond:
            self.closed = True
            spares = [s for v in self.ready.values() for s in v]
            self.ready.clear()
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join(timeout=SETTLE_S)
        for s in spares:
            s.discard()


#: this process's spares
SPARES = Spares()


def prepare(device: str) -> None:
    """An evaluator process that will evaluate candidates on `device` starts what their children need now, in the
    background: on the CPU, the fork server (`zygote.py`: Python, torch, Triton and the harness imported and warmed,
    ~1.5 s of CPU), so the first candidate's child is forked from it as every later one is, instead of a fresh
    interpreter started beside the server. Nothing when the children would not be forked (GPU, no jail, or
    TIK_FORK_SERVER=0) or spares are off (TIK_PRESTART=0)."""
    mode = isolation(trusted=False)[0]
    if prestart_depth() and forks(mode, device, "private"):
        SPARES.serve_early(mode, device)


def _signal_group(pgid: int, sig: int) -> None:
    """`sig` to a spare's process group (its launcher leads one, as does a fork server's holder); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _groups_stopped(pgids: set[int]) -> bool:
    """Every process of these groups stopped (or gone): /proc's state of each process whose group is among them,
    read in one pass."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) in pgids and fields[0] not in ("T", "t", "Z", "X"):
            return False
    return True


def boot_parts(spare: Spare) -> dict[str, float]:
    """The seconds of each part of a ready spare's start: the parent's ("spawn") and those the child wrote into its
    READY file (`child._prestarted`); {} where it wrote none (not ready, or an older child)."""
    try:
        parts = json.loads((spare.tmp / "scratch" / READY).read_text() or "{}")
    except (OSError, ValueError):
        parts = {}
    if not isinstance(parts, dict) or not parts:
        return {}
    out = {k: float(v) for k, v in parts.items() if isinstance(v, (int, float))}
    if spare.spawn_s is not None:
        out["spawn"] = round(spare.spawn_s, 4)
    return out


def _hold_until_ready(spare: Spare, hold) -> None:
    """Let go of `hold` (the device's lock, shared: `devlock`) once `spare` has started (READY), ended, or had
    SETTLE_S: its start (a CUDA context, warm-up kernels) is GPU work another TIK process's timing waits for."""
    try:
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and spare.starting():
            time.sleep(POLL_S)
    finally:
        hold.__exit__(None, None, None)


def quiet_spares(device: str):
    """`SPARES.quiet(device)`: a block within which `device` is timed with its starting spares paused."""
    return SPARES.quiet(device)


def settle_spares(device: str) -> float:
    """`SPARES.settle(device)`: the seconds waited until no spare for `device` is starting."""
    return SPARES.settle(device)


def _spawn_spare(mode: str | None, device: str, limits: dict, cache: str) -> Spare:
    """Start a child that waits for its first job (`child._prestarted`) in a new scratch directory (in this thread,
    which lives as long as the process: the fork server is started here when this child is one it would serve)."""
    servers.SERVERS.ensure(mode, device, cache)
    tmp = _child_tempdir("tik-spare-", mode, device, cache)
    own = None
    try:
        scratch = tmp / "scratch"
        (scratch / "work").mkdir(parents=True)
        (tmp / "impl").mkdir()
        inside = JAIL_IMPL if mode is not None else str(tmp / "impl")
        (scratch / "job.json").write_text(_dumps({"mode": "spare", "device": device, "limits": limits,
                                                  "start": f"{inside}/{START}", "idle_s": SPARE_MAX_AGE_S + 60,
                                                  "gate": {"hold": f"{inside}/{HOLD}", "mark": AT_DEVICE}}))
        if cache == "candidate":
            own = owned_tempdir("tik-cand-triton-")
            cache_dir = _seeded(own / "triton-cache")
        else:
            cache_dir = triton_cache(cache, scratch)
        proc, spec = _start(tmp, mode, device, cache, cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
        raise
    return Spare(tmp, proc, (mode, device, cache, _dumps(limits)), spec, cache_dir, own, time.monotonic())


def _top_up(cache_dir: Path, mode: str | None) -> None:
    """Copy into a spare's seeded cache what the trusted cache gained since it was seeded (the spare has run no
    candidate yet: nothing of its own is there to trust or distrust)."""
    if sandbox._TRUSTED_CACHE is None or not sandbox._TRUSTED_CACHE.is_dir():
        return
    for entry in sandbox._TRUSTED_CACHE.iterdir():
        dst = cache_dir / entry.name
        if entry.name.startswith("tmp.") or os.path.lexists(dst):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dst)
        else:
            shutil.copyfile(entry, dst)
        if mode == "nobody":
            _give(dst)
