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
    jit = _jit_function()
    if jit is None:
        return []
    original = jit._do_compile
    seen: set = set()
    asked: list[tuple[Any, tuple, dict]] = []

    def recorder(self, *args, **kwargs):
        # args[0] is the specialization key (signature, constants, options), args[2] the device
        key = (id(self), repr(args[0]) if args else None, repr(args[2]) if len(args) > 2 else None)
        if key not in seen:
            seen.add(key)
            asked.append((self, args, kwargs))
        return None

    jit._do_compile = recorder
    try:
        for call in calls:
            try:
                call()
            except Exception:  # garbage inputs to host code after a skipped kernel: this probe's recording ends
                pass
    finally:
        jit._do_compile = original
    return asked


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


def load_cached(asked: list[tuple[Any, tuple, dict]]) -> list[tuple[Any, tuple, dict]]:
    """Load, here, each of `asked` that the cache already holds (Triton's own lookup, `_do_compile` with compiling
    replaced by raising `_Miss`): the kernel goes into its function's in-memory cache, where the real pass's first
    launch finds it. What is left, returned, is what must be compiled. Most of a tuner candidate's kernels are the
    root's, in the cache already, and a hit costs a few ms here (3 ms for the attention forward, compiled for sm_90 on
    the CPU machine, once Triton's installation key is known: `child.warm_triton`). On the H200 an attention
    candidate's probes spent 3.4 s compiling ahead with nothing to compile (the dry run and a forked worker per kernel
    held, eval_rate_h200_s17_devprofile_attention.md); how much of it this saves is not measured yet."""
    jit, cls = _jit_function(), _backend_class()
    if jit is None or cls is None or not asked:
        return list(asked)
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
                left.append((fn, args, kwargs))
            if time.monotonic() - t > LOOKUP_LIMIT_S:
                # a lookup that long compiled (a Triton whose compile reaches no `add_stages` on a miss): what is
                # left goes to the workers, so at most one kernel is compiled here, one after another
                return left + list(asked[i + 1:])
    finally:
        cls.add_stages = original
    return left


def compile_recorded(asked: list[tuple[Any, tuple, dict]], workers: int | None = None,
                     timeout_s: float = TIMEOUT_S) -> dict:
    """Compile `asked` (from `record`): what the cache holds is loaded here (`load_cached`), the rest is compiled in
    up to `workers` forked processes; returns what happened, for the phase table: kernels asked, kernels the cache
    held, workers used, workers that failed or were killed."""
    jit = _jit_function()
    if jit is None or not asked:
        return {"kernels": len(asked), "cached": 0, "workers": 0, "failed": 0, "compile_s": 0.0}
    t0 = time.monotonic()
    todo = load_cached(asked)
    out = {"kernels": len(asked), "cached": len(asked) - len(todo)}
    if not todo:
        return {**out, "workers": 0, "failed": 0, "compile_s": time.monotonic() - t0}
    n = max(1, min(workers or os.cpu_count() or 1, MAX_WORKERS, len(todo)))
    shares = [todo[i::n] for i in range(n)]
    pids = []
    for share in shares:
        pid = os.fork()
        if pid == 0:  # the worker: compile its share into the child's cache, then leave without any cleanup
            code = 0
            try:
                _quiet_hooks()
                for fn, args, kwargs in share:
                    try:
                        _launcher(jit._do_compile(fn, *args, **kwargs))
                    except BaseException:  # noqa: B036 (the real pass reports a failing compile itself)
                        code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    failed, last = _reap(pids, time.monotonic() + timeout_s)
    return {**out, "workers": n, "failed": failed, "compile_s": last - t0}


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


def _reap(pids: list[int], deadline: float) -> tuple[int, float]:
    """Wait for the workers until `deadline`, kill those left: (how many did not exit with 0, when the last one
    ended)."""
    failed, left = 0, set(pids)
    while left:
        for pid in list(left):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                left.discard(pid)
                failed += int(not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0))
        if left and time.monotonic() > deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
            failed += len(left)
            break
        if left:
            time.sleep(0.005)
    return failed, time.monotonic()


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
