"""Compile a child's Triton kernels ahead of its probes, side by side on the host's cores.

A tuner candidate moves a tile or a warp count and so changes the constants of a handful of kernels; each new
specialization is compiled the first time a probe launches it, one after another, in the child (the H200: 11
kernels, 6.9 of a probes phase's 7.3 s). Compilation is CPU work that does not need the GPU, so it can run on
several cores at once:

1. **Record.** Every probe is called once with Triton's compile step replaced by a recorder
   (`JITFunction._do_compile`, the method `run` calls on a cache miss; a `None` from it means "no kernel",
   exactly as when Triton's own `jit_cache_hook` declines a compile): nothing is compiled, nothing is launched,
   and the host code around the kernels runs as it will for real, so the recorder sees the specializations the
   probes will ask for (shapes, strides, alignment, constants, grad mode). Outputs of this pass are garbage and
   thrown away; an exception in it only ends the recording of that probe.
2. **Compile.** The distinct specializations are compiled in forked workers, a share each. A worker calls the
   original `_do_compile`, which compiles and writes the child's own Triton cache (the directory the real pass
   reads), builds the kernel's launcher where Triton compiles one, then exits without touching CUDA (a process
   forked from a CUDA process may not use it; compiling does not).
3. The probes then run as always: each kernel's first launch finds its binary in the cache and loads it.

The timing child does the same before its cells (`timing._dry_cells`): one dry call per cell for the candidate, the
root and the incumbent, at the cell's shapes and at the row counts it computes again after the timed rounds.

Nothing here decides anything: a worker that fails, hangs (killed at `timeout_s`) or a Triton without this
method leaves the real pass to compile as it always did, in-process. The workers run inside the child's jail, as
the child does, with its limits. Off the GPU (the interpreter compiles nothing) there is nothing to do."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

#: the GPU children compile ahead: a probes child the kernels its probes will launch, a timing child those of every
#: implementation at every cell's shapes; off, each compiles at its first launch, one after another
#: (`bench_eval_rate --ahead`)
ENABLED = True
#: at most this many workers compile at once (each is a fork of the child: a few hundred MB of shared pages)
MAX_WORKERS = 16
#: a worker still busy after this long is killed; its kernels compile in the real pass instead
TIMEOUT_S = 60.0
#: a cache lookup in the child (`load_cached`) takes milliseconds; one that took longer compiled instead
LOOKUP_LIMIT_S = 1.0


def _jit_function() -> Any:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    return JITFunction if callable(getattr(JITFunction, "_do_compile", None)) else None


def record(calls: Iterable[Callable[[], Any]]) -> list[tuple[Any, tuple, dict]]:
    """Run each of `calls` with Triton's compile step recorded instead of done: the distinct
    (jit function, args, kwargs) of `_do_compile` the calls asked for, in first-asked order."""
    return record_calls(calls)[0]


def record_calls(calls: Iterable[Callable[[], Any]]) -> tuple[list[tuple[Any, tuple, dict]], list[list[int]]]:
    """`record`, and for each call the indices (into what was asked) of the specializations it asked for."""
    jit = _jit_function()
    if jit is None:
        return [], [[] for _ in calls]
    original = jit._do_compile
    seen: dict = {}
    asked: list[tuple[Any, tuple, dict]] = []
    per_call: list[list[int]] = []

    def recorder(self, *args, **kwargs):
        # args[0] is the specialization key (signature, constants, options), args[2] the device
        key = (id(self), repr(args[0]) if args else None, repr(args[2]) if len(args) > 2 else None)
        if key not in seen:
            seen[key] = len(asked)
            asked.append((self, args, kwargs))
        if seen[key] not in per_call[-1]:
            per_call[-1].append(seen[key])
        return None

    jit._do_compile = recorder
    try:
        for call in calls:
            per_call.append([])
            try:
                call()
            except Exception:  # garbage inputs to host code after a skipped kernel: this probe's recording ends
                pass
    finally:
        jit._do_compile = original
    return asked, per_call


class _Miss(Exception):
    """Raised where Triton starts compiling: the kernel asked for is not in the cache."""


def _backend_class() -> Any:
    """The class of the compiler backend of this process's device, whose `add_stages` Triton's `compile` calls only on a
    cache miss (after it has looked in the cache, before any compiling), or None."""
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        cls = type(make_backend(driver.active.get_current_target()))
    except Exception:
        return None
    return cls if callable(getattr(cls, "add_stages", None)) else None


def load_cached(asked: list[tuple[Any, tuple, dict]]) -> list[int]:
    """Load, here, each of `asked` that the cache already holds (Triton's own lookup, `_do_compile` with compiling
    replaced by raising `_Miss`): the kernel goes into its function's in-memory cache, where the real pass's first
    launch finds it. What is left, returned (indices into `asked`), is what must be compiled. Most of a tuner
    candidate's kernels are the root's, in the cache already, and a hit costs a few ms here (3 ms for the attention
    forward, compiled for sm_90 on the CPU machine, once Triton's installation key is known: `child.warm_triton`).
    On the H200 an attention candidate's probes spent 3.4 s compiling ahead with nothing to compile (the dry run and
    a forked worker per kernel held, eval_rate_h200_s17_devprofile_attention.md); how much of it this saves is not
    measured yet."""
    jit, cls = _jit_function(), _backend_class()
    if jit is None or cls is None or not asked:
        return list(range(len(asked)))
    original = cls.add_stages

    def miss(*args, **kwargs):
        raise _Miss

    left = []
    cls.add_stages = miss
    try:
        for i, (fn, args, kwargs) in enumerate(asked):
            t = time.monotonic()
            try:
                jit._do_compile(fn, *args, **kwargs)
            except Exception:  # _Miss, or anything a worker (or the real pass) will meet and report again
                left.append(i)
            if time.monotonic() - t > LOOKUP_LIMIT_S:
                # a lookup that long compiled (a Triton whose compile reaches no `add_stages` on a miss): what is
                # left goes to the workers, so at most one kernel is compiled here, one after another
                return left + list(range(i + 1, len(asked)))
    finally:
        cls.add_stages = original
    return left


def compile_recorded(asked: list[tuple[Any, tuple, dict]], workers: int | None = None,
                     timeout_s: float = TIMEOUT_S) -> dict:
    """Compile `asked` (from `record`): what the cache holds is loaded here (`load_cached`), the rest is compiled in
    up to `workers` forked processes; returns what happened, for the phase table: kernels asked, kernels the cache
    held, workers used, workers that failed or were killed."""
    out = Background(asked, workers, timeout_s).finish()
    del out["wait_s"]  # nothing ran beside it
    return out


class Background:
    """`asked` compiled as `compile_recorded` does, but returning as soon as the workers are forked: the real pass
    runs meanwhile, and waits (`wait`) only before a call that needs a kernel still being compiled (a call the
    recording saw asking for it). `ready` says whether a call's kernels are all there; `finish` waits for the
    rest and returns `compile_recorded`'s figures, with `wait_s`: the seconds the real pass waited."""

    def __init__(self, asked: list[tuple[Any, tuple, dict]], workers: int | None = None,
                 timeout_s: float = TIMEOUT_S):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout_s
        self.kernels = len(asked)
        self.share: dict[int, int] = {}  # index into asked -> the pid of the worker compiling it
        self.left: set[int] = set()  # workers not reaped yet
        self.failed, self.last, self.wait_s, self.n = 0, self.t0, 0.0, 0
        jit = _jit_function()
        self.cached = 0
        if jit is None or not asked:
            return
        todo = load_cached(asked)
        self.cached = len(asked) - len(todo)
        self.last = time.monotonic()
        if not todo:
            return
        self.n = n = max(1, min(workers or os.cpu_count() or 1, MAX_WORKERS, len(todo)))
        for k in range(n):
            share = todo[k::n]
            pid = os.fork()
            if pid == 0:  # the worker: compile its share into the child's cache, then leave without any cleanup
                code = 0
                try:
                    _quiet_hooks()
                    for i in share:
                        fn, args, kwargs = asked[i]
                        try:
                            _launcher(jit._do_compile(fn, *args, **kwargs))
                        except BaseException:  # noqa: B036 (the real pass reports a failing compile itself)
                            code = 1
                finally:
                    os._exit(code)
            self.left.add(pid)
            self.share.update(dict.fromkeys(share, pid))

    def _reap(self, pids: set[int], block: bool) -> None:
        """Reap `pids` (of `left`): those that ended; with `block`, all of them, killing what is left at the
        deadline (its kernels are compiled by the real pass, as without a worker)."""
        pids = pids & self.left
        while pids:
            for pid in list(pids):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    pids.discard(pid)
                    self.left.discard(pid)
                    self.failed += int(not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0))
                    self.last = time.monotonic()
            if not block or not pids:
                return
            if time.monotonic() > self.deadline:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                    except OSError:
                        pass
                self.failed += len(pids)
                self.left -= pids
                self.last = time.monotonic()
                return
            time.sleep(0.005)

    def _pids(self, indices: Iterable[int]) -> set[int]:
        return {self.share[i] for i in indices if i in self.share} & self.left

    def ready(self, indices: Iterable[int]) -> bool:
        """Whether every kernel of `indices` is compiled (or never went to a worker)."""
        pids = self._pids(indices)
        self._reap(pids, block=False)
        return not (pids & self.left)

    def wait(self, indices: Iterable[int]) -> None:
        """Until every worker compiling a kernel of `indices` has ended (or was killed at the deadline)."""
        pids = self._pids(indices)
        if pids:
            t = time.monotonic()
            self._reap(pids, block=True)
            self.wait_s += time.monotonic() - t

    def order(self, per_call: list[list[int]]) -> list[int]:
        """The calls (indices into `per_call`) in the order to run them: those whose kernels are all there now first,
        then the others, each group in its own order (a call may then wait for fewer workers, or none)."""
        now = [i for i, ks in enumerate(per_call) if self.ready(ks)]
        ready = set(now)
        return now + [i for i in range(len(per_call)) if i not in ready]

    def finish(self) -> dict:
        self._reap(set(self.left), block=True)
        return {"kernels": self.kernels, "cached": self.cached, "workers": self.n, "failed": self.failed,
                "compile_s": self.last - self.t0, "wait_s": self.wait_s}


def _launcher(kernel: Any) -> None:
    """Build `kernel`'s launcher too, where the Triton version compiles one per signature with the host's C compiler
    into the same cache (a later Triton's launcher is generic: then this only makes an object). Loading the kernel
    onto the device, the other half of a first launch, stays with the real pass (no CUDA in a forked worker)."""
    if kernel is None:
        return
    try:
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # the first launch builds it as usual
        pass


def _quiet_hooks() -> None:
    """No compile hooks in a worker (one that declined compiles would make the worker do nothing)."""
    try:
        from triton import knobs

        knobs.runtime.jit_cache_hook = None
        knobs.runtime.jit_post_compile_hook = None
    except Exception:
        pass


def start_ahead(calls: list[Callable[[], Any]], workers: int | None = None,
                timeout_s: float = TIMEOUT_S) -> tuple[Background, list[list[int]], float]:
    """`record_calls` then a `Background` compile: (the compile, each call's kernels, the seconds recording took).
    The probes child runs its probes while the workers compile, those whose kernels are ready first."""
    t = time.monotonic()
    asked, per_call = record_calls(calls)
    recorded = time.monotonic() - t
    return Background(asked, workers, timeout_s), per_call, recorded


def compile_ahead(calls: Iterable[Callable[[], Any]], workers: int | None = None,
                  timeout_s: float = TIMEOUT_S) -> dict:
    """`record` then `compile_recorded`; adds the seconds recording took (`record_s`) and both (`s`)."""
    t = time.monotonic()
    asked = record(calls)
    recorded = time.monotonic() - t
    out = compile_recorded(asked, workers, timeout_s)
    out["record_s"] = recorded
    out["s"] = time.monotonic() - t
    return out
