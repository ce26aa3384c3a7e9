"""The candidate side: `python -m tik_kernels.evaluator.child WORKDIR`, spawned by the trusted parent.

Everything in this process is untrusted once the implementation file is imported. It reads
`WORKDIR/job.json` (+ a probes job's `inputs.bin`, in its read-only job directory, mapped rather than copied),
imports the implementation(s) by path, runs the job and writes `WORKDIR/out/result.json` + `out/outputs.bin`
(with a probes job's `phases`: where its time went, which the parent reports and decides nothing on). It never
sees a reference output or a check: those stay in the parent, which validates whatever comes back. stdout and
stderr go to files the parent only tails for a failure line, so printing cannot break the protocol.

Jobs: `probes` (run the contract's probes on one implementation), `time` (the timing
harness of `tik_kernels.evaluator.timing` on the candidate, root, incumbent and baseline) and
`evidence` / `ncu_cell` (compile stats and work per cell, `tik_kernels.evaluator.evidence`).

A child started before its candidate existed (`spares.Spares`) is started on a `spare` job: it imports, initialises
its device and waits for its probes job (`_prestarted`), then runs it as above.

A probes job with `next` (a path the parent writes and this process can only read, `spawn.PhasedChild`)
is the first of two: after its reply this process waits for the parent's decision there, `{"stop": true}`
or `{"job": <a time job>}`, and runs that job on the implementation it has already imported (as
"candidate"), replying the same way in a fresh `out/` (the parent has taken the first one away).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from tik_kernels.evaluator import ahead as _AHEAD
from tik_kernels.evaluator.outputs import check_outputs, one_line  # noqa: F401 (one_line: used by callers)


def _limit_resources(job: dict) -> None:
    """No core dumps (a segfault must die fast); on CPU a cap on address space and CPU seconds."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limits = job.get("limits", {})
    if limits.get("cpu_s"):
        s = int(limits["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (s, s + 5))
    # CUDA reserves huge virtual ranges: an address-space cap only makes sense without a GPU
    if limits.get("address_space_bytes") and not str(job.get("device", "cpu")).startswith("cuda"):
        n = int(limits["address_space_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (n, n))


#: modules an implementation may not import: the harness that measures it, and the store and UI that record it
GUARDED_PREFIXES = ("tik_kernels.evaluator", "tik_store", "tik_tui")


def _guarded(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in GUARDED_PREFIXES)


class _RefuseGuarded:
    """A meta-path finder consulted before any other: an import of a guarded module fails, however its name was
    spelled (the source screen in `core.source_policy` only sees names written out in the source)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if _guarded(name):
            raise ImportError(f"an implementation may not import {name} (the evaluator's own modules)")
        return None


def guard_imports() -> None:
    """Called once the harness has imported what it needs, before the first implementation is imported.

    Guarded modules already loaded are dropped from `sys.modules` and from their parent package's attributes
    (the harness keeps its own references), and `_RefuseGuarded` refuses to load them again: an implementation
    that spells `importlib.import_module("tik_kernels." + "evalu" + "ator.timing")` to patch the timer gets an
    ImportError. This is a guard against reaching the harness by import, not a sandbox: code in this process
    can still walk frames or the garbage collector to the harness's objects. What the parent decides never
    rests on it: timings are checked against the timed outputs, the profiler and a control run, and every
    output is checked in the parent."""
    if any(isinstance(f, _RefuseGuarded) for f in sys.meta_path):
        return
    for name in [n for n in sys.modules if _guarded(n)]:
        mod = sys.modules.pop(name)
        parent, _, attr = name.rpartition(".")
        if parent in sys.modules and getattr(sys.modules[parent], attr, None) is mod:
            delattr(sys.modules[parent], attr)
    sys.meta_path.insert(0, _RefuseGuarded())


class GuardedModule:
    """The implementation seen through a filter: every entry point's outputs must be plain, dense,
    contiguous tensors on the probe's device that own their storage and alias no input."""

    def __init__(self, module: Any, device: str):
        self._module = module
        self._device = device

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._module, name, None)
        if not callable(fn):
            return None

        def call(*args, **kwargs):
            try:
                out = fn(*args, **kwargs)
            except Exception:
                raise
            except BaseException as e:  # SystemExit / KeyboardInterrupt from the candidate
                raise RuntimeError(f"entry point raised {type(e).__name__}") from None
            check_outputs(out, args, kwargs, self._device)
            return out

        return call


def run_probes_job(workdir: Path, job: dict) -> dict:
    import torch

    from tik_kernels.contract import Probe, Staged, call_probe, execute_probe, load_module, same_bits

    protocol = _protocol()
    TensorWriter, decode, read_tensors = protocol.TensorWriter, protocol.decode, protocol.read_tensors

    t0 = time.monotonic()
    cached = _cache_entries()
    # a pre-started child's inputs come with its job, in its read-only implementation directory
    tensors = read_tensors(Path(job["inputs"]) if job.get("inputs") else workdir / "inputs.bin", job["tensors"],
                           mapped=True)
    probes, sent = [], {}
    for p in job["probes"]:
        gos = decode(p["grad_outputs"], tensors) if p["grad_outputs"] is not None else None
        probes.append(Probe(p["id"], p["entry"], decode(p["args"], tensors), decode(p["kwargs"], tensors),
                            grad_args=tuple(p["grad_args"]), grad_outputs=gos, echo_inputs=True))
        # the input index of each top-level tensor argument, in order (what inputs_after echoes)
        sent[p["id"]] = [a["t"] for a in p["args"]["tuple"] if "t" in a]
    del tensors
    # the reply's channel, connected before the implementation is imported (its own connection would come second)
    shared = protocol.SharedOutputs.open(job.get("reply_socket"))
    t1 = time.monotonic()
    try:
        module = load_module(job["impl"], "tik_impl")
    except BaseException as e:  # noqa: B036 (SystemExit at import is an import failure too)
        if shared is not None:
            shared.abandon()
        return {"import_error": one_line(e)}
    t2 = time.monotonic()
    _HELD["impl"] = module  # a second job (`next`) times this module, not another import of the file
    guarded = GuardedModule(module, job["device"])
    out_dir = workdir / "out"
    w = shared.writer if shared is not None else TensorWriter(out_dir / "outputs.bin")

    # inputs moved to the device once, each probe's copied from there (`Staged`)
    staged = Staged(job["device"])

    def echo(after: torch.Tensor, before: torch.Tensor, index: int) -> int | dict:
        # an input left bitwise as it was sent is named, not sent back (a probe's weight is often GBs); compared
        # on the device with the copy it was made from
        if same_bits(after, staged.master(before)):
            return {"input": index}
        return w.ref(after.to("cpu"))
    background, order, recorded = None, list(range(len(probes))), 0.0
    if str(job["device"]).startswith("cuda") and job.get("compile_ahead", True):
        # the kernels every probe will launch, found by a dry run, compiled on all cores at once (`ahead`) while the
        # probes whose kernels the cache held run; a probe waits only for the workers compiling its own kernels
        dry = [(lambda p=p: call_probe(guarded, p, job["device"], values=False)) for p in probes]
        background, needs, recorded = _AHEAD.start_ahead(dry)
        order = background.order(needs)
    t_ahead = time.monotonic()
    results = {}
    for i in order:
        probe = probes[i]
        if background is not None:
            background.wait(needs[i])
        r = execute_probe(guarded, probe, job["device"], staged=staged)
        if r.error is not None:
            results[probe.id] = {"error": r.error, "outputs": [], "inputs_after": None}
            continue
        results[probe.id] = {"error": None, "outputs": [w.ref(t) for t in r.outputs],
                             "inputs_after": [echo(t, a, k) for t, a, k in zip(
                                 r.inputs_after or [], [a for a in probe.args if isinstance(a, torch.Tensor)],
                                 sent[probe.id], strict=False)]}
    ahead = background.finish() if background is not None else {}
    compiled_ahead = _cache_entries() - cached  # the workers' kernels, and any the probes compiled themselves
    staged.drop()  # the device copies' memory goes back before the graph replays and the timing job
    t3, sent_probes = time.monotonic(), w.write_s
    graphs = {}
    if str(job["device"]).startswith("cuda"):
        for probe in probes:
            if probe.id in set(job.get("graph_probes", ())):
                graphs[probe.id] = graph_replay(guarded, probe, job["device"], w)
    t4, sent_graphs = time.monotonic(), w.write_s - sent_probes
    t = time.monotonic()
    entries = shared.send() if shared is not None else w.close()
    w.write_s += time.monotonic() - t
    # where this job's time went, in this process's own clock (the parent's phase tables: `core.probe_phases`)
    phases = {"inputs": t1 - t0, "import": t2 - t1, "ahead": t_ahead - t2, "compute": t3 - t_ahead - sent_probes,
              "graph": t4 - t3 - sent_graphs, "send": w.write_s, "start": t0 - _HELD.get("claimed", t0),
              "compiled": _cache_entries() - cached, "ahead_compiled": compiled_ahead,
              "ahead_kernels": ahead.get("kernels", 0), "ahead_cached": ahead.get("cached", 0),
              "ahead_workers": ahead.get("workers", 0), "ahead_failed": ahead.get("failed", 0),
              "ahead_record_s": recorded, "ahead_wait_s": ahead.get("wait_s", 0.0),
              "boot_wait": _HELD.pop("boot_wait", 0.0)}
    return {"import_error": None, "probes": results, "graphs": graphs, "tensors": entries, "phases": phases,
            "via": "memfd" if shared is not None else "file"}


def _cache_entries() -> int:
    """How many kernels this child's Triton cache holds (one directory per compiled kernel): the probes phase reports
    how many it compiled (0 under the CPU interpreter, which compiles nothing)."""
    try:
        return sum(1 for e in os.scandir(os.environ.get("TRITON_CACHE_DIR", "")) if not e.name.startswith("tmp."))
    except OSError:
        return 0


def _protocol() -> Any:
    """The protocol module: imported as usual, or (in a guarded child, where it can no longer be imported) the module
    main() held on to."""
    mod = _HELD.get("protocol")
    if mod is None:
        from tik_kernels.evaluator import protocol as mod
    return mod


#: harness modules main() keeps references to before guard_imports drops them from sys.modules
_HELD: dict[str, Any] = {}


def graph_replay(module: Any, probe: Any, device: str, w: Any) -> dict:
    """Capture the call in a CUDA graph, change the inputs in place (AReaL-TIK's q.neg_(), mul_(0.5),
    add_(0.125) on every float input), replay, then call eagerly on copies of the changed inputs: the
    parent requires both to have the same bits (a kernel that bakes in its inputs, or caches by address,
    differs)."""
    import torch

    fn = getattr(module, probe.entry, None)
    if fn is None:
        return {"error": f"entry point {probe.entry}() missing", "replay": [], "eager": []}
    with torch.no_grad():
        return _graph_replay(fn, probe, device, w)


def _graph_replay(fn: Any, probe: Any, device: str, w: Any) -> dict:
    import torch

    from tik_kernels.contract import flatten_outputs

    try:
        args = tuple(a.detach().to(device, copy=True) if isinstance(a, torch.Tensor) else a for a in probe.args)
        kwargs = {k: v.detach().to(device, copy=True) if isinstance(v, torch.Tensor) else v
                  for k, v in probe.kwargs.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = flatten_outputs(fn(*args, **kwargs))
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a.neg_()
                a.mul_(0.5)
                a.add_(0.125)
        graph.replay()
        torch.cuda.synchronize()
        replay = [t.detach().to("cpu", copy=True) for t in captured]
        # the fresh call gets copies at new addresses: a result cached by address cannot match the replay
        fresh_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        fresh_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        eager = [t.detach().to("cpu", copy=True) for t in flatten_outputs(fn(*fresh_args, **fresh_kwargs))]
        torch.cuda.synchronize()
        del graph
        return {"error": None, "replay": [w.ref(t) for t in replay], "eager": [w.ref(t) for t in eager]}
    except Exception as e:
        try:
            torch.cuda.synchronize()
        except Exception:  # a poisoned context: the parent sees the first error
            pass
        return {"error": one_line(e), "replay": [], "eager": []}


#: bound before any implementation is imported (one that patches time.sleep does not change the wait)
_sleep = time.sleep
#: how often a waiting child looks for the parent's decision
NEXT_POLL_S = 0.01


def await_next(path: Path, limit_s: float | None = None) -> dict:
    """The parent's decision after the first reply (written atomically; the parent kills this process if it
    never comes), or a pre-started child's first job; {} after `limit_s`."""
    t0 = time.monotonic()
    while True:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            if limit_s is not None and time.monotonic() - t0 > limit_s:
                return {}
            _sleep(NEXT_POLL_S)
            continue
        return doc if isinstance(doc, dict) else {}


def warm_triton() -> None:
    """What a CUDA process's first Triton launch pays once, paid by a pre-started child before its candidate exists:
    the driver (its C utilities, loaded from the Triton cache), Triton's version key (a hash of the installation,
    libtriton's ~500 MB among it: 0.35 s on the CPU machine) and the backend's (ptxas's version, a subprocess). These
    are Triton's own per-process caches of facts about the installation, the same for every candidate."""
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        make_backend(driver.active.get_current_target()).hash()
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # older Triton keeps it with the compiler
            from triton.compiler.compiler import triton_key
        triton_key()
    except Exception:  # a head start only: the candidate's first launch does all this itself
        pass


def warm_device(device: str) -> None:
    """What the timing job's first profiled call, first CUDA graph capture and first cuBLAS call pay once per process
    (CUPTI and the profiler's own start, the graph machinery, cuBLAS's handle and workspace), paid by a pre-started
    child before its candidate exists, on a few microseconds of work of its own. On the H200 the per-cell profiles
    took ~2.2 s of every evaluation whether the op had 39 cells or 48, which is a once-per-process cost, not a
    per-cell one. Also the kernel that writes the probes' inputs late where that is on (`tik_kernels/contract/late.py`).
    The same for every candidate; a failure here only means the candidate's child pays it later."""
    import torch

    try:
        from torch.profiler import ProfilerActivity, profile

        x = torch.ones(64, 64, device=device, dtype=torch.bfloat16)
        (x @ x.T).float().sum().item()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(1000)
            y = x + 1
            torch.cuda.synchronize()
        prof.events()  # the trace is parsed once too
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x + 1
        graph.replay()
        torch.cuda.synchronize()
        from tik_kernels.contract import late

        if late.active(device):  # the late inputs' writer kernel, compiled and loaded
            late.write_late([(x.view(-1), late.poisoned_like(x.view(-1)))])()  # written, released at once
            torch.cuda.synchronize()
        del graph, y, x
        torch.cuda.empty_cache()
    except Exception:  # a head start only
        pass


def device_gate(mark: Path, hold: Path, limit_s: float) -> None:
    """A pre-started child's last step before its device: write `mark` (in its scratch: it is here), then wait while
    `hold` exists (in its read-only job directory: its parent is timing the device, `spares.Spares.quiet`). Its start
    up to here (the interpreter, torch, Triton: seconds of CPU) runs beside a timing; its device work waits for the
    timing's end. The mark is written before the hold is looked at, and the parent writes the hold before it looks
    at the mark, so one of the two sees the other: a child already past this gate is one the parent pauses instead."""
    mark.write_text("")
    deadline = time.monotonic() + limit_s
    while hold.exists() and time.monotonic() < deadline:
        _sleep(NEXT_POLL_S)


def _launch_s() -> float:
    """Seconds from this process's creation to now (called at `main`'s start: the interpreter's start and the
    imports before `main`, a fresh interpreter's torch and Triton, almost none in a fork of the fork server). Linux's
    /proc (clock ticks since boot against the boot clock); 0.0 where it cannot be read."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        born = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: the start time
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - born)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _prestarted(workdir: Path, boot: dict) -> dict:
    """A pre-started child (`spares.Spares`): import what a probes job imports, initialise the device, then wait
    for the first job, which the parent writes where this process can only read (`boot["start"]`). Nothing of a
    candidate has run here yet. The job is then this child's job.json, as if it had been started with it."""
    marks = [time.monotonic()]
    import torch
    import triton  # noqa: F401 (what a candidate imports first)

    import tik_kernels.contract  # noqa: F401

    marks.append(time.monotonic())
    if str(boot["device"]).startswith("cuda"):
        if "gate" in boot:
            device_gate(workdir / boot["gate"]["mark"], Path(boot["gate"]["hold"]), limit_s=float(boot["idle_s"]))
        marks.append(time.monotonic())
        torch.empty(1, device=boot["device"]).cpu()  # the CUDA context, and a first copy back
        marks.append(time.monotonic())
        warm_triton()
        marks.append(time.monotonic())
        warm_device(boot["device"])
        marks.append(time.monotonic())
    ready = workdir / "ready"
    # the seconds of each part of this start, from this process's creation, for the parent's statistics
    # (`Spares.stats["boot_s"]`): what an evaluation may still wait for (`spare_settle`, `boot_wait`)
    parts = ("start", "imports", "gate", "cuda_context", "warm_triton", "warm_device")
    marks.insert(0, _HELD.get("claimed", marks[0]))
    took = {k: round(b - a, 4) for k, a, b in zip(parts, marks, marks[1:], strict=False)}
    ready.write_text(json.dumps({"launch": round(_HELD.get("launch_s", 0.0), 4), **took}))
    doc = await_next(Path(boot["start"]), limit_s=float(boot["idle_s"]))
    _HELD["claimed"] = time.monotonic()
    # how long the job waited for this start to end (the job file's age when read: one host clock), the part of a
    # spare's start an evaluation still waits for once timings pause the spares instead (`spares.Spares.quiet`)
    with contextlib.suppress(OSError):
        _HELD["boot_wait"] = max(0.0, time.time() - Path(boot["start"]).stat().st_mtime - NEXT_POLL_S)
    job = doc.get("job")
    if not isinstance(job, dict) or job.get("mode") != "probes":
        os._exit(0)  # never taken (the parent stopped waiting for it), or nothing this child serves
    ready.unlink(missing_ok=True)
    (workdir / "job.json").write_text(json.dumps(job))
    return job


def main(argv: list[str]) -> int:
    workdir = Path(argv[1])
    _HELD["claimed"] = time.monotonic()  # a pre-started child's job is claimed later (`_prestarted`)
    _HELD["launch_s"] = _launch_s()
    job = json.loads((workdir / "job.json").read_text())
    _limit_resources(job)
    # kernels first: it sets TRITON_INTERPRET before anything imports Triton
    import tik_kernels  # noqa: F401
    from tik_kernels.evaluator import protocol

    _HELD["protocol"] = protocol
    from tik_kernels.evaluator.protocol import write_json
    from tik_kernels.evaluator.timing import run_timing_job

    if job["mode"] == "spare":
        job = _prestarted(workdir, job)
    if job["mode"] in ("evidence", "ncu_cell"):
        from tik_kernels.evaluator.evidence import run_evidence_job, run_ncu_cell_job
    (workdir / "out").mkdir(exist_ok=True)
    # the harness has what it needs: from here on its modules cannot be imported (the implementations come next)
    guard_imports()
    if job["mode"] == "probes":
        doc = run_probes_job(workdir, job)
    elif job["mode"] == "time":
        doc = run_timing_job(workdir, job)
    elif job["mode"] in ("evidence", "ncu_cell"):
        doc = (run_evidence_job if job["mode"] == "evidence" else run_ncu_cell_job)(workdir, job)
    else:
        raise SystemExit(f"unknown job mode {job['mode']!r}")
    doc["done"] = True
    write_json(workdir / "out" / "result.json", doc)
    if job["mode"] == "probes" and job.get("next") and "impl" in _HELD:
        # the probes' tensors went with their job: their memory goes back while the parent checks
        del doc
        gc.collect()
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        nxt = await_next(Path(job["next"]))
        if nxt.get("job", {}).get("mode") == "time":
            (workdir / "out").mkdir()
            doc = run_timing_job(workdir, nxt["job"], imported={"candidate": _HELD["impl"]})
            doc["done"] = True
            write_json(workdir / "out" / "result.json", doc)
    sys.stdout.flush()
    # skip interpreter teardown: a candidate's atexit hooks or thread joins cannot hang the reply
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
