"""One evaluation job, as every executor runs it: what it carries, what comes back, how it runs.

The shared vocabulary of the search head (`tik_tui.agent.loop`) and the executors
(`executor.py`, `ray_executor.py`): they all import this module and it imports none of them,
so data flows one way: head -> job -> executor -> outcome -> head. A job carries sources, not
paths, so it can run on another machine.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: a job whose process dies is run this many times in all before it is recorded as failed
ATTEMPTS = 2


class ExecutorError(ValueError):
    """A user-facing executor problem (unknown executor, no ray, unreachable cluster): one line."""


@dataclass
class EvalJob:
    op: str
    impl_id: int
    source: str
    root_id: int | None = None
    root_source: str | None = None
    incumbent_id: int | None = None
    incumbent_source: str | None = None
    device: str | None = None
    timeout: float = 120.0
    time_it: bool | None = None


@dataclass
class ScreenJob:
    """A screen (`tik_kernels.evaluator.screen`): `sources` timed beside `parent_source`, `rounds` rounds per cell,
    in one sandboxed child on the executor's device, the same way an evaluation runs there (one slot, one
    GPU): so a search screens with several workers and on Ray too, and a screen never shares a GPU with
    an evaluation. `root_source`: the operator's root, whose probes the worker runs first (once per process)
    so the screen's copy of the compile cache starts from the root's kernels."""

    op: str
    parent_source: str
    sources: list[str]
    rounds: int
    root_source: str | None = None
    device: str | None = None
    timeout: float = 120.0


@dataclass
class Outcome:
    #: the EvalReport as a dict, when evaluate() returned
    report: dict | None = None
    #: evaluate() raised: "Type: message" (the candidate fails, no retry)
    error: str | None = None
    trace: str | None = None
    #: the process running the job died: why (retried once)
    lost: str | None = None
    #: where and when it ran: executor, slot, host, pid, gpu, started, finished (epoch seconds)
    worker: dict = field(default_factory=dict)
    #: a ScreenJob's result (`tik_kernels.evaluator.screen.screen`'s dict), and why warming the root failed (the
    #: search records it as a `warm_root_failed` event)
    screen: dict | None = None
    warm_root_failure: str | None = None


def report_dict(rep: Any) -> dict:
    return rep.as_dict() if hasattr(rep, "as_dict") else dict(rep)


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def run_job(job: EvalJob | ScreenJob, evaluate: Callable | None = None, worker: dict | None = None) -> Outcome:
    """Write the job's sources to a private directory and evaluate (or screen) there (wherever "there" is)."""
    worker = {"host": socket.gethostname(), "pid": os.getpid(), **(worker or {}), "started": time.time()}
    if isinstance(job, ScreenJob):
        out = _run_screen(job)
        out.worker = {**worker, "finished": time.time()}
        return out
    if evaluate is None:
        from tik_kernels.evaluator import evaluate
    tmp = Path(tempfile.mkdtemp(prefix="tik-job-"))
    try:
        def write(impl_id: int | None, source: str | None) -> str | None:
            if source is None:
                return None
            p = tmp / f"{job.op}_{impl_id}.py"
            p.write_text(source)
            return str(p)

        cand = write(job.impl_id, job.source)
        root = write(job.root_id, job.root_source)
        inc = write(job.incumbent_id, job.incumbent_source)
        extra = {} if job.time_it is None else {"time_it": job.time_it}
        try:
            rep = evaluate(job.op, cand, root_path=root, incumbent_path=inc, device=job.device, timeout=job.timeout,
                           **extra)
            out = Outcome(report=report_dict(rep))
        except Exception as e:  # an evaluator crash fails this candidate, not the search
            out = Outcome(error=one_line(e), trace=traceback.format_exc()[-2000:])
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    out.worker = {**worker, "finished": time.time()}
    return out


def _run_screen(job: ScreenJob) -> Outcome:
    import shutil

    from tik_kernels.evaluator.core import warm_root
    from tik_kernels.evaluator.screen import screen

    device = job.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        warm_failure = None
        if job.root_source is not None and device.startswith("cuda"):
            tmp = Path(tempfile.mkdtemp(prefix="tik-root-"))
            try:
                path = tmp / f"{job.op}_root.py"
                path.write_text(job.root_source)
                try:
                    warm_root(job.op, device=device, timeout=job.timeout, root_path=path)
                except Exception as e:  # a broken root: its evaluation says so; the screen goes on
                    warm_failure = str(e)[:300]
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return Outcome(screen=screen(job.op, job.parent_source, list(job.sources), device=device, rounds=job.rounds,
                                     timeout=job.timeout), warm_root_failure=warm_failure)
    except Exception as e:  # a screen decides nothing: its failure is the proposer's to skip
        return Outcome(error=one_line(e), trace=traceback.format_exc()[-2000:])


def load_evaluator(spec: str) -> Callable:
    """`module:function` or `path/to/file.py:function` (a test seam for injecting an evaluator)."""
    target, _, fn = spec.rpartition(":")
    if target.endswith(".py"):
        s = importlib.util.spec_from_file_location("tik_injected_evaluator", target)
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    func = getattr(mod, fn)
    try:
        # so evaluator processes of a local pool can load it the same way
        func.__tik_spec__ = spec
    except (AttributeError, TypeError):
        pass
    return func


def portable_evaluator(evaluate: Callable | None) -> tuple[str, Any] | None:
    """How a slot process gets the evaluator: None (the real one), a `module:fn` spec, or pickled bytes."""
    if evaluate is None:
        return None
    spec = getattr(evaluate, "__tik_spec__", None)
    if spec:
        return ("spec", spec)
    try:
        return ("pickle", pickle.dumps(evaluate))
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ExecutorError(f"the evaluator {getattr(evaluate, '__qualname__', evaluate)!r} cannot be sent to "
                            f"worker processes ({type(e).__name__}): use one worker") from None


def load_portable(p: tuple[str, Any] | None) -> Callable | None:
    if p is None:
        return None
    kind, value = p
    if kind == "spec":
        return load_evaluator(value)
    return pickle.loads(value)
