"""Where evaluations run: in the head process, on a pool of local evaluator processes, or on Ray.

The search (the head) records every proposal in the store, submits its evaluation here and
records the outcome when it comes back; executors never touch the store, so it stays
single-writer. A job carries the sources of the candidate, the root and the incumbent (not
paths), so it can run on another machine; one job is one `evaluate()` call, which times the
candidate interleaved with the root and the incumbent in one child on one device. Nothing
here splits a job, so measurements that are compared are always taken together.

Executors:

- `inline`: one slot, the evaluation in a thread of the head (today's behaviour, the default).
- `local`: N slots, each a long-lived evaluator process (`slot_main`) fed jobs over a pipe. On
  a GPU there is one slot per visible GPU, pinned with CUDA_VISIBLE_DEVICES: the evaluator's
  sandbox copies its parent's environment into the candidate's child, so the pin reaches it.
  On the CPU N interpreter processes share the cores.
- `ray`: each job a Ray task needing one GPU (one CPU on a CPU-only cluster) on an existing
  cluster; Ray pins the GPU with CUDA_VISIBLE_DEVICES the same way.

`submit(job)` returns a `concurrent.futures.Future` that always resolves to an `Outcome`,
never raises. `Outcome.lost` says the process running the job died (an evaluator process
killed, a Ray worker or node lost): the search retries such a job once. A candidate that
crashes its own sandbox child is not a lost job: the evaluator reports it as a failure.

The job, the outcome and how one runs are in `jobs.py`; this module imports `ray_executor.py`
(only when asked for ray), never the other way round.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import tik_tui
from tik_tui.agent.jobs import (
    EvalJob,
    ExecutorError,
    Outcome,
    load_portable,
    one_line,
    portable_evaluator,
    run_job,
)

EXECUTORS = ("local", "ray")
#: the directory holding tik_tui (and, in a checkout, kernels and store), for slot processes
PACKAGE_ROOT = Path(tik_tui.__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- inline


class InlineExecutor:
    """One slot: the evaluation runs in a daemon thread of the head, so the head keeps polling."""

    name = "inline"
    slots = 1
    device = None

    def __init__(self, evaluate: Callable | None = None, device: str | None = None):
        self.evaluate = evaluate
        if evaluate is None:
            _prepare(device)

    def submit(self, job: EvalJob) -> Future:
        fut: Future = Future()

        def work() -> None:
            fut.set_result(run_job(job, self.evaluate, {"executor": "inline", "slot": 0}))

        # a daemon thread (not a pool): a second Ctrl-C must be able to end the head at once
        threading.Thread(target=work, name=f"tik-eval-{getattr(job, 'impl_id', 'screen')}", daemon=True).start()
        return fut

    def describe(self) -> dict:
        return {"executor": "local", "workers": 1}

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- local pool


def _exit_reason(rc: int | None) -> str:
    if rc is None:
        return "no exit status"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


class _Slot:
    """One evaluator process and the head thread that feeds it."""

    def __init__(self, index: int, pin: str | None, hello: dict):
        self.index, self.pin, self.hello = index, pin, hello
        self.proc: subprocess.Popen | None = None
        self.busy = False

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.pin is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.pin
        return env

    def start(self) -> None:
        # its own session: a Ctrl-C in the terminal reaches the head, which finishes what is in flight
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tik_tui.agent.executor import slot_main; slot_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env(), start_new_session=True, close_fds=True)
        pickle.dump(self.hello, self.proc.stdin)
        self.proc.stdin.flush()

    def run(self, job: EvalJob) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        proc = self.proc
        where = {"executor": "local", "slot": self.index, "pid": proc.pid, "gpu": self.pin}
        t0 = time.time()
        try:
            pickle.dump(job, proc.stdin)
            proc.stdin.flush()
            out = pickle.load(proc.stdout)
            if not isinstance(out, Outcome):
                raise pickle.UnpicklingError("not an Outcome")
            return out
        except (EOFError, OSError, pickle.UnpicklingError):
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
                rc = proc.returncode
            self.proc = None
            return Outcome(lost=f"evaluator process {proc.pid} (slot {self.index}) died: {_exit_reason(rc)}",
                           worker={**where, "started": t0, "finished": time.time()})

    def kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            # SIGTERM first: the slot's evaluator then kills the candidate's child on its way out
            proc.terminate()
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self.proc = None


class LocalPool:
    """N evaluator processes on this machine; a job goes to the first idle one."""

    name = "local"
    device = None

    def __init__(self, workers: int, *, evaluate: Callable | None = None, pins: list[str | None] | None = None,
                 device: str | None = None):
        self.slots = workers
        self.pins = list(pins or [None] * workers)
        #: where the slots share the root's CPU probe results (`core.ROOT_SHARE`): slots without a GPU share the cores
        self.root_share: Path | None = None
        if evaluate is None and not any(p is not None for p in self.pins):
            from tik_kernels.evaluator.sandbox import owned_tempdir

            self.root_share = owned_tempdir("tik-roots-")
        hello = {"sys_path": list(sys.path), "evaluator": portable_evaluator(evaluate), "device": device,
                 "root_share": None if self.root_share is None else str(self.root_share)}
        self._slots = [_Slot(k, self.pins[k], {**hello, "slot": k}) for k in range(workers)]
        self._jobs: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._serve, args=(s,), name=f"tik-slot-{s.index}", daemon=True)
                         for s in self._slots]
        for t in self._threads:
            t.start()

    def _serve(self, slot: _Slot) -> None:
        try:
            # started now, so its interpreter and the evaluator's imports overlap the first proposal
            slot.start()
        except OSError:
            slot.proc = None
        while True:
            item = self._jobs.get()
            if item is None:
                slot.stop()
                return
            job, fut = item
            slot.busy = True
            try:
                out = slot.run(job)
            except Exception as e:  # a bug here must not hang the search
                out = Outcome(lost=f"slot {slot.index}: {one_line(e)}")
            slot.busy = False
            fut.set_result(out)

    def submit(self, job: EvalJob) -> Future:
        fut: Future = Future()
        self._jobs.put((job, fut))
        return fut

    def describe(self) -> dict:
        return {"executor": "local", "workers": self.slots, "gpus": [p for p in self.pins if p is not None]}

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for s in self._slots:
            if s.busy:
                s.kill()
        for t in self._threads:
            t.join(timeout=10)
        if self.root_share is not None:
            shutil.rmtree(self.root_share, ignore_errors=True)


def _prepare(device: str | None) -> None:
    """What the real evaluator's children will need, started now in the background (`spares.prepare`: on the CPU
    the fork server), so it overlaps the first proposal instead of the first evaluation's critical path."""
    try:
        import torch

        from tik_kernels.evaluator.spares import prepare

        prepare(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except Exception:  # a head start only: the first evaluation starts what it needs itself
        pass


def slot_main() -> None:
    """A slot process: read the hello, then jobs (pickled, on stdin); write Outcomes to the original stdout."""
    out = os.fdopen(os.dup(1), "wb")
    # anything the evaluator prints goes to stderr, never into the protocol
    os.dup2(2, 1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp = sys.stdin.buffer
    hello = pickle.load(inp)
    sys.path[:0] = [p for p in hello.get("sys_path", []) if p not in sys.path]
    try:
        evaluate, problem = load_portable(hello.get("evaluator")), None
        if evaluate is None:
            import tik_kernels.evaluator  # noqa: F401  (warm: torch and triton load before the first job)
            from tik_kernels.evaluator import core

            if hello.get("root_share"):
                core.ROOT_SHARE = Path(hello["root_share"])
            _prepare(hello.get("device"))
    except Exception as e:
        evaluate, problem = None, f"cannot load the evaluator in the worker process: {one_line(e)}"
    where = {"executor": "local", "slot": hello.get("slot"), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}
    while True:
        try:
            job = pickle.load(inp)
        except EOFError:
            return
        if problem:
            result = Outcome(error=problem, worker={**where, "pid": os.getpid()})
        else:
            result = run_job(job, evaluate, where)
        pickle.dump(result, out)
        out.flush()


# ----------------------------------------------------------------------------- choosing


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs)."""
    import torch

    n = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [d.strip() for d in env.split(",") if d.strip()][:n]
    return [str(i) for i in range(n)]


def gpu_pins(gpus: list[str], n: int) -> list[str]:
    """The GPU of each of n evaluator processes: one each while there are GPUs enough, else round-robin."""
    return [gpus[k % len(gpus)] for k in range(n)]


def _validate(kind: str, address: str | None, workers: int | None) -> None:
    if kind not in EXECUTORS:
        raise ExecutorError(f"unknown executor {kind!r} (use {' or '.join(EXECUTORS)})")
    if workers is not None and workers < 1:
        raise ExecutorError(f"--workers must be at least 1 (got {workers})")
    if kind == "local" and address:
        raise ExecutorError("--address is only used with --executor ray")


def check_options(executor: str | None, address: str | None, workers: int | None) -> None:
    """Cheap validation for the command line, before anything starts (or detaches)."""
    kind = executor or "local"
    _validate(kind, address, workers)
    if kind == "ray":
        from tik_tui.agent.ray_executor import check_cluster

        check_cluster(address)


def make_executor(executor: str | None = "local", *, address: str | None = None, workers: int | None = None,
                  device: str | None = None, evaluate: Callable | None = None) -> Any:
    """The executor for `tik search --executor ... --address ... --workers ...`."""
    kind = executor or "local"
    _validate(kind, address, workers)
    if kind == "ray":
        from tik_tui.agent.ray_executor import RayExecutor

        return RayExecutor(address, evaluate=evaluate, device=device, workers=workers)
    gpus: list[str] = []
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            gpus = visible_gpus()
    if device and device.startswith("cuda") and not gpus:
        raise ExecutorError("--device cuda but no GPU is visible")
    if gpus:
        n = workers or len(gpus)
        # more workers than GPUs: evaluator processes pinned round-robin, several to a GPU, whose timings and GPU work
        # take turns there (tik_kernels/evaluator/devlock.py) while their CPU work (checks, compiles, the judge's
        # host side) overlaps the others'
        return InlineExecutor(evaluate, device) if n == 1 else LocalPool(n, evaluate=evaluate, pins=gpu_pins(gpus, n),
                                                                         device=device)
    n = workers or 1
    return InlineExecutor(evaluate, device) if n == 1 else LocalPool(n, evaluate=evaluate, device=device)
