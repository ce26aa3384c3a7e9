"""Several TIK processes on one GPU take turns at it: a timing never runs beside another TIK process's GPU work.

Two searches on one GPU (two workspaces, two terminals), or `tik bench` beside a search, used to time each other's
kernels: the integrity checks then failed good candidates for the other's load ("the root ran 50x slower beside the
candidate than alone"), recorded in the IR as the candidate's failure, or passed timings a neighbour had skewed.
Within one process nothing of the kind happens (one evaluation at a time owns a GPU, and `spares.Spares.quiet`
pauses the children still starting while it is timed); across processes this lock does it:

- an evaluation on a GPU holds its device's lock *shared* from start to end (`core.evaluate`), and so does a
  pre-started child while it starts (its CUDA context, its warm-up kernels: `spares.Spares`);
- a timing holds it *exclusive*: the candidate's, its control's, a screen's (`core._quiet`, `measure.run_timing`).

So another process's timing waits for an evaluation's probes and references and for a child's start, and they
wait for it. The lock is an advisory `flock` on `<dir>/<the GPU's UUID>.lock` (dir: $TIK_DEVICE_LOCK_DIR, else
/tmp/tik-device-locks) with a turnstile beside it that keeps a waiting timing from being starved (`DeviceLock`),
each one open file per process and device: this process's own holders never wait for each other (they share the
open file), other processes' do; exclusive holders of one process take turns (threads). The waits poll (a blocked
`flock` cannot time out) and give up after WAIT_S: a holder that never lets go (a process stopped in a debugger)
delays a timing, never stops the search; the report's `device_wait` phase says how long a timing waited, and
`device_wait_gave_up` that it went on without the lock.

Not covered: GPU work of programs that are not TIK (a training job beside a search): the timing's integrity checks
are what see that. $TIK_DEVICE_LOCK=0: no lock (one process per GPU is then the user's to ensure).

The GPU's identity is its NVML UUID (CUDA_VISIBLE_DEVICES taken into account, no CUDA context created), else the
CUDA device's own UUID, so processes that number the GPUs differently still share one lock per GPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ENV = "TIK_DEVICE_LOCK"
DIR_ENV = "TIK_DEVICE_LOCK_DIR"
DEFAULT_DIR = Path("/tmp/tik-device-locks")
#: the longest a holder waits for the lock before going on without it (seconds)
WAIT_S = 600.0
#: the first and the longest pause between two tries
POLL_S, POLL_MAX_S = 0.002, 0.05


class DeviceLock:
    """One device's lock, as this process holds it: `shared()` and `exclusive()` blocks, nested and from any thread.
    Each block yields {"wait_s": seconds waited for the lock, "gave_up": whether it went on without it}.

    Two files: the lock (`<key>.lock`), shared or exclusive, and a turnstile (`<key>.queue`) that a process waiting to
    hold it exclusive holds meanwhile, and that a process about to hold it shared passes (takes and lets go) first:
    so a timing waits only for the holders there were when it asked, not for an endless overlap of one process's
    evaluations and its children's starts (a writer-preferring readers-writer lock). A process that holds it shared
    lets go before it queues for the exclusive lock, and takes it shared again after: it never holds one while
    waiting for the other, so two processes cannot wait for each other. While it waits, its own shared holders are
    not covered: they are the children that `spares.Spares.quiet` pauses first, and the evaluation's own thread,
    which is the one waiting."""

    def __init__(self, path: Path, wait_s: float | None = None):
        self.path, self.queue_path = path, path.with_suffix(".queue")
        self.wait_s = WAIT_S if wait_s is None else wait_s
        self.mutex = threading.Lock()  # the counts and every flock call
        self.turn = threading.RLock()  # this process's exclusive holders, one thread at a time
        self.fds: dict[Path, int] = {}
        self.shared_n = 0
        self.exclusive_n = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[dict]:
        out = {"wait_s": 0.0, "gave_up": False}
        with self.mutex:
            if not self.shared_n and not self.exclusive_n:
                out.update(self._acquire(fcntl.LOCK_SH))
            self.shared_n += 1
        try:
            yield out
        finally:
            with self.mutex:
                self.shared_n -= 1
                if not self.shared_n and not self.exclusive_n:
                    self._flock(self.path, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[dict]:
        out = {"wait_s": 0.0, "gave_up": False}
        t0 = time.monotonic()
        with self.turn:
            with self.mutex:
                if not self.exclusive_n:
                    if self.shared_n:
                        self._flock(self.path, fcntl.LOCK_UN)
                    out.update(self._acquire(fcntl.LOCK_EX))
                self.exclusive_n += 1
            out["wait_s"] = time.monotonic() - t0
            try:
                yield out
            finally:
                with self.mutex:
                    self.exclusive_n -= 1
                    if not self.exclusive_n:
                        if self.shared_n:  # straight back to shared: no turnstile for a holder that never left
                            self._poll(self.path, fcntl.LOCK_SH, time.monotonic())
                        else:
                            self._flock(self.path, fcntl.LOCK_UN)

    def _acquire(self, op: int) -> dict:
        """The lock as `op` (holding nothing now): through the turnstile, polling until WAIT_S in all."""
        t0 = time.monotonic()
        if not self._poll(self.queue_path, fcntl.LOCK_EX, t0):
            return {"wait_s": time.monotonic() - t0, "gave_up": True}
        try:
            if op == fcntl.LOCK_SH:  # passed: the shared lock needs no place in the queue
                self._flock(self.queue_path, fcntl.LOCK_UN)
            ok = self._poll(self.path, op, t0)
        finally:
            self._flock(self.queue_path, fcntl.LOCK_UN)
        return {"wait_s": time.monotonic() - t0, "gave_up": not ok}

    def _poll(self, path: Path, op: int, t0: float) -> bool:
        """flock(path, op), tried until WAIT_S after t0 (a blocked flock cannot time out): whether it was had."""
        pause = POLL_S
        while True:
            try:
                fcntl.flock(self._fd(path), op | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            except OSError:  # no lock file can be made here (a read-only /tmp): go on as before there was a lock
                return False
            if time.monotonic() - t0 >= self.wait_s:
                return False
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)

    def _flock(self, path: Path, op: int) -> None:
        with contextlib.suppress(OSError):
            if path in self.fds:
                fcntl.flock(self.fds[path], op)

    def _fd(self, path: Path) -> int:
        fd = self.fds.get(path)
        if fd is None:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(path.parent, 0o1777)  # any user's TIK shares it; none removes another's file
            # read-only is enough for flock, and lets a file another user created (mode 0644 under a umask) be used;
            # never inherited by a child (O_CLOEXEC): a candidate must not hold, or outlive with, this process's lock
            fd = self.fds[path] = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)
        return fd


_LOCKS: dict[str, DeviceLock] = {}
_LOCKS_MUTEX = threading.Lock()
_KEYS: dict[str, str] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() != "0"


def lock_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR)


def for_device(device: str) -> DeviceLock | None:
    """This process's lock of `device` (a GPU), or None: a CPU device, or $TIK_DEVICE_LOCK=0."""
    if not device.startswith("cuda") or not enabled():
        return None
    key = _KEYS.get(device)
    if key is None:
        key = _KEYS[device] = gpu_key(device)
    path = lock_dir() / f"{key}.lock"
    with _LOCKS_MUTEX:
        lock = _LOCKS.get(str(path))
        if lock is None:
            lock = _LOCKS[str(path)] = DeviceLock(path)
        return lock


def shared(device: str):
    """`for_device(device).shared()`, or a block that waits for nothing."""
    lock = for_device(device)
    return lock.shared() if lock is not None else contextlib.nullcontext({"wait_s": 0.0, "gave_up": False})


def exclusive(device: str):
    """`for_device(device).exclusive()`, or a block that waits for nothing."""
    lock = for_device(device)
    return lock.exclusive() if lock is not None else contextlib.nullcontext({"wait_s": 0.0, "gave_up": False})


def gpu_key(device: str) -> str:
    """A file name for the GPU `device` names, the same in every process on this machine: its UUID."""
    import torch

    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    try:
        uuids = torch.cuda._raw_device_uuid_nvml()  # NVML: no CUDA context; torch's private helpers, hence the guard
        if uuids:
            return _safe(uuids[torch.cuda._get_nvml_device_index(index)])
    except Exception:
        pass
    try:
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            return _safe(f"GPU-{uuid}")
    except Exception:
        pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = visible.split(",") if visible else []
    entry = entries[index].strip() if index < len(entries) else index
    return _safe(f"cuda-{entry}")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name))
