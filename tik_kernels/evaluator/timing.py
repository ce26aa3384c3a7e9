"""The timing harness (runs in the child) and the statistics the parent draws from it.

The harness owns the shapes: it builds every cell's inputs itself from the contract's
`bench_case`, for several seeds ("variants"). All implementations are called on the same
argument tensors, whose *contents* are rewritten from the variant pools before every sample,
so a result cached by address or by call count is stale and fails the parent's check of the
timed outputs. One round times every implementation once, in a random order (interleaved
A/B/A/B against root, incumbent and stock-PyTorch baseline in the same process).

One GPU sample: L2 flushed (a 256 MiB memset) → device synchronized → a spin kernel queued so
the host's launch latency is hidden → start event → call → end event → device synchronized.
Alongside the event time the host wall time to the whole-device sync is kept, and one call per
cell is run under the profiler to count the candidate's kernels on every stream: work launched
on a side stream shows up there (kernel time far above the event window) and in the wall time,
not in the events. On the CPU only wall times exist, and they are Triton-interpreter times.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

# bound here: once the harness guards its modules (child.guard_imports) they can no longer be imported
from tik_kernels.evaluator.child import one_line as _one_line

FLUSH_BYTES = 256 << 20
#: GPU idle the spin kernel covers while the host launches the timed call
#: (ops_h200_spin200.json once measured the rmsnorm root at 52 us with 200 us of spin and 4 us with
#: 1000; that run predates the warm calibration below, whose absence made spins far shorter than
#: asked, so it does not show that 200 us is too little: 1000 is kept as the measured-good value)
SPIN_US = 1000.0
#: outputs larger than this (elements) come back as a random subset of rows, drawn after the timed calls
MAX_SENT_ELEMS = 1 << 22

# Bound when this module is imported, which is before any implementation is: a candidate that
# patches torch.cuda.Event or time.perf_counter afterwards does not change what the harness calls.
_perf = time.perf_counter
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_sync = torch.cuda.synchronize
_spin = torch.cuda._sleep


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(args)
    walk(kwargs)
    return out


def variant_seeds(seed: int, n: int) -> list[int]:
    return [seed * 1009 + 7919 * v + 1 for v in range(n)]


class Timer:
    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        if self.cuda:
            self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.spin_cycles = self._calibrate()

    def _calibrate(self) -> int:
        """Spin cycles that keep the GPU busy for at least SPIN_US at its highest clock.

        The spin kernel counts clock cycles, so its length in time follows the SM clock, which an
        idle GPU drops (an idle H200 sat at 345 of 1980 MHz). Calibrated cold, the spin came out
        ~6x too short once the clock rose, host launch time leaked into the event window, and the
        rmsnorm root timed 80-150 us instead of 4 (benchmarks/results/evaluator_h200_badspin.md).
        So: the spin's module is loaded first (its first launch is not measured), a long spin
        raises the clock, three measured spins follow back to back with no host gap, and the
        fastest rate is kept — a lower clock or any host delay only ever makes a spin longer.
        """
        _spin(1000)
        _sync()
        cycles = 200_000
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(3)]
        _spin(20_000_000)
        for a, b in events:
            _record(a)
            _spin(cycles)
            _record(b)
        _sync()
        rate = max(cycles / max(_elapsed(a, b) * 1e3, 1.0) for a, b in events)
        spin = max(1000, int(rate * SPIN_US))
        _record(self.start)
        _spin(spin)
        _record(self.end)
        _sync()
        self.spin_us = _elapsed(self.start, self.end) * 1e3
        return spin

    def sample(self, fn) -> tuple[Any, float, float]:
        """(output, event µs, wall µs). On the CPU both times are the host wall time."""
        if not self.cuda:
            t0 = _perf()
            out = fn()
            us = (_perf() - t0) * 1e6
            return out, us, us
        self.flush.zero_()
        _sync()
        _spin(self.spin_cycles)
        t0 = _perf()
        _record(self.start)
        out = fn()
        _record(self.end)
        _sync()
        wall = (_perf() - t0) * 1e6
        return out, _elapsed(self.start, self.end) * 1e3, wall

    def profile(self, fn) -> dict:
        """Kernels that ran during one call, on any stream, against the event window of that call."""
        if not self.cuda:
            return {"error": "no profiler on cpu"}
        try:
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile

            self.flush.zero_()
            _sync()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _spin(self.spin_cycles)
                _record(self.start)
                fn()
                _record(self.end)
                _sync()
            window = _elapsed(self.start, self.end) * 1e3
            spin, kernels = None, []
            device_events = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                                   key=lambda e: e.time_range.start)
            for e in device_events:
                iv = (e.time_range.start, e.time_range.end)
                # the first spin kernel is the harness's; any later one belongs to the call
                if spin is None and "spin" in e.name.lower():
                    spin = iv
                else:
                    kernels.append(iv)
            overlap = sum(1 for s, _ in kernels if spin is not None and spin[0] <= s < spin[1])
            return {"kernels": len(kernels), "kernel_us": float(sum(b - a for a, b in kernels)),
                    "window_us": float(window), "overlap_spin": overlap, "saw_spin": spin is not None}
        except Exception as e:  # a profiler that does not work here is reported, never fatal
            return {"error": f"{type(e).__name__}: {e}"[:200]}


def run_timing_job(workdir: Path, job: dict) -> dict:
    from tik_kernels.contract import Contract, flatten_outputs, load_module
    from tik_kernels.evaluator.child import check_outputs, guard_imports, one_line
    from tik_kernels.evaluator.protocol import TensorWriter

    device = job["device"]
    cmod = load_module(job["contract_file"], "tik_contract")
    contract = next(v for v in vars(cmod).values() if isinstance(v, Contract) and v.op == job["op"])
    cells = {c.name: c for c in contract.cells(job["profile"])}
    # trusted implementations are imported before the candidate, in the order given; none may import the harness
    guard_imports()
    mods, errors = {}, {}
    for name, path in job["impls"]:
        try:
            mods[name] = load_module(path, f"tik_{name}")
        except BaseException as e:  # noqa: B036
            errors[name] = "import failed: " + one_line(e)
    timer = Timer(device)
    w = TensorWriter(workdir / "out" / "outputs.bin")
    doc: dict = {"import_errors": errors, "cells": {}, "floor_us": None, "spin_us": getattr(timer, "spin_us", None)}
    floor = [timer.sample(lambda: None)[1] for _ in range(job["reps"])]
    doc["floor_us"] = statistics.median(floor)
    for cname in job["cells"]:
        try:
            doc["cells"][cname] = _time_cell(contract, cells[cname], mods, job, timer, w, check_outputs,
                                             flatten_outputs)
        except Exception as e:
            doc["cells"][cname] = {"error": one_line(e)}
    doc["tensors"] = w.close()
    return doc


def _time_cell(contract, cell, mods, job, timer: Timer, w, check_outputs, flatten_outputs) -> dict:
    t_start = time.perf_counter()
    device = job["device"]
    seeds = variant_seeds(job["seed"], job["variants"])
    cases = [contract.bench_case(cell, s, device) for s in seeds]
    case = cases[0]
    bufs = tensors_of(case.args, case.kwargs)
    pools = [[t.clone() for t in tensors_of(c.args, c.kwargs)] for c in cases]
    del cases[1:]

    def load(v: int) -> None:
        for b, p in zip(bufs, pools[v], strict=True):
            b.copy_(p)

    fns: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, m in mods.items():
        fn = getattr(m, case.entry, None)
        if callable(fn):
            fns[name] = (lambda fn=fn: fn(*case.args, **case.kwargs))
        else:
            errors[name] = f"entry point {case.entry}() missing"
    if case.baseline is not None and job.get("baseline", True):
        fns["baseline"] = case.baseline
    keep = set(job.get("return_outputs", ()))
    samples: dict[str, dict[str, list]] = {n: {"event_us": [], "wall_us": []} for n in fns}
    outs: dict[str, list] = {n: [None] * len(pools) for n in fns if n in keep}

    def guarded(name: str, v: int, timed: bool):
        load(v)
        if timed:
            out, ev, wall = timer.sample(fns[name])
            samples[name]["event_us"].append(ev)
            samples[name]["wall_us"].append(wall)
        else:
            out = fns[name]()
        if name != "baseline":
            check_outputs(out, case.args, case.kwargs, device)
        return out

    def drop(name: str, e: BaseException) -> None:
        errors[name] = one_line_(e)
        fns.pop(name, None)
        samples.pop(name, None)
        outs.pop(name, None)

    for name in list(fns):
        try:
            for _ in range(job["warmup"]):
                for v in range(len(pools)):
                    guarded(name, v, timed=False)
        except Exception as e:
            drop(name, e)
    if timer.cuda:
        torch.cuda.synchronize()
    prof = {}
    if job.get("profile_kernels") and timer.cuda:
        for name in ("candidate", "root"):
            if name in fns:
                load(0)
                prof[name] = timer.profile(fns[name])
    rng = random.Random(job["seed"] ^ 0x5EED)
    # rounds: at least min_reps, then until the cell's time budget is spent, at most reps; a round times
    # every implementation once, so every implementation gets the same number of samples
    min_reps, budget = job.get("min_reps", job["reps"]), job.get("cell_budget_s")
    t_timed, rounds = time.perf_counter(), 0
    for r in range(job["reps"]):
        if r >= min_reps and budget is not None and time.perf_counter() - t_timed > budget:
            break
        rounds += 1
        v = r % len(pools)
        order = list(fns)
        rng.shuffle(order)
        for name in order:
            if name not in fns:
                continue
            try:
                out = guarded(name, v, timed=True)
            except Exception as e:
                drop(name, e)
                continue
            if name in outs:
                outs[name][v] = out
    if timer.cuda:
        torch.cuda.synchronize()
    sent: dict[str, list] = {}
    picks: dict = {}  # one row sample per (variant, output, shape), shared by every implementation
    for name, per_v in outs.items():
        try:
            sent[name] = [[_send(t, w, picks, (v, k)) for k, t in enumerate(flatten_outputs(o))]
                          for v, o in enumerate(per_v) if o is not None]
        except Exception as e:
            errors[name] = one_line_(e)
    return {"samples": samples, "errors": errors, "profile": prof, "outputs": sent, "seeds": seeds,
            "rounds": rounds,
            "seconds": {"warmup": round(t_timed - t_start, 3), "timed": round(time.perf_counter() - t_timed, 3)}}


def _send(t: torch.Tensor, w, picks: dict, key: tuple) -> dict:
    """A timed output, whole, or (when huge) a subset of rows drawn now, after every call has returned."""
    if t.numel() <= MAX_SENT_ELEMS or t.dim() == 0 or t.shape[0] < 2:
        return {"data": w.ref(t), "rows": None}
    key = (*key, tuple(t.shape))
    if key not in picks:
        per_row = max(1, t.numel() // t.shape[0])
        k = max(1, min(t.shape[0], MAX_SENT_ELEMS // per_row))
        gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        idx = torch.randperm(t.shape[0], generator=gen)[:k].sort().values
        picks[key] = (idx, w.ref(idx))
    idx, ref = picks[key]
    return {"data": w.ref(t[idx.to(t.device)]), "rows": ref}


def one_line_(e: BaseException) -> str:
    return _one_line(e)


# ----------------------------------------------------------------------------- parent side: statistics


def summarize(xs: list[float]) -> dict:
    """Median and spread (inter-quartile range) of a list of samples in µs."""
    if not xs:
        return {"median_us": None, "spread_us": None, "samples": 0}
    s = sorted(xs)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        spread = q[2] - q[0]
    else:
        spread = s[-1] - s[0]
    return {"median_us": statistics.median(s), "spread_us": spread, "samples": len(s)}
