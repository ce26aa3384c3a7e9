"""The timing harness (runs in the child) and the statistics the parent draws from it.

The harness owns the shapes: it builds every cell's inputs itself from the contract's
`bench_case`, for several seeds ("variants"). All implementations are called on the same
argument tensors, whose *contents* are rewritten from the variant pools before every sample,
so a result cached by address or by call count is stale and fails the parent's check of the
timed outputs. One round times every implementation once, in a random order (interleaved
A/B/A/B against root, incumbent and stock-PyTorch baseline in the same process).

One GPU sample: L2 flushed (a 256 MiB memset) → a spin kernel queued behind it, so the host's launch
latency is hidden (the host does not wait for the flush: flush and spin both cover its launches) → start
event → call → end event → device synchronized.
On the GPU the call is the replay of a CUDA graph of the implementation's call, captured once per
cell (`_capture_all`): work the call launches on another stream is then either in the graph or
makes the capture fail, so no work escapes the events, whatever its size. A microsecond kernel is
captured `calls` times back to back, call k on its own input set (`_calls_per_sample`): timed one
replay of one call at a time, identical code captured in two graphs came out up to 8.6% apart on
the H200's 4-5 us cells (benchmarks/results/evaluator_cheats_h200.md), a fixed per-replay cost that
paired rounds do not average away; `calls` calls share it. Every contender of a cell gets the same
`calls`, the input sets hold distinct variants (a call that hands back an earlier call's result is
wrong on its own inputs), and a sample's time is per call. Alongside the event
time the host wall time to the whole-device sync is kept; one eager call per cell is profiled
(kernels on every stream must lie between the spin and a marker after the end event) and timed a
few times eagerly, so a candidate that hides work from the events when not captured is rejected,
not only made harmless. After the timed rounds a few timed rows are computed again, alone and in
a small batch, for the parent's bitwise comparison with the timed call's rows (`_rows_again`).
On the CPU only wall times exist, and they are Triton-interpreter times.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

# imported here, not where used: once the child guards the harness's modules (child.guard_imports) they can
# no longer be imported
from tik_kernels.contract import Contract, flatten_outputs, load_module, variants_of
from tik_kernels.evaluator import ahead as _AHEAD
from tik_kernels.evaluator.outputs import check_outputs, one_line
from tik_kernels.evaluator.protocol import TensorWriter

FLUSH_BYTES = 256 << 20
#: GPU idle the spin kernel covers while the host launches the timed call
#: (ops_h200_spin200.json once measured the rmsnorm root at 52 us with 200 us of spin and 4 us with
#: 1000; that run predates the warm calibration below, whose absence made spins far shorter than
#: asked, so it does not show that 200 us is too little: 1000 is kept as the measured-good value)
SPIN_US = 1000.0
#: the marker spin queued after a profiled call's end event (cycles: a few µs)
MARKER_CYCLES = 2000
#: eager samples of candidate and root per cell when the timed samples are graph replays (the eager-vs-graph
#: evidence of `measure.integrity_ok`)
EAGER_SAMPLES = 5
#: timed rows recomputed per input variant: this many alone (T = 1 each) and up to ROWS_BATCH as one batch
ROWS_ALONE = 2
ROWS_BATCH = 32
#: outputs larger than this (elements) come back as a random subset of rows, drawn after the timed calls
MAX_SENT_ELEMS = 1 << 22
#: a graph-replayed sample lasts at least this long: a cell whose root call is shorter is captured `calls` times
#: back to back (a power of two, so that a few percent of noise in the estimate rarely changes it)
SAMPLE_TARGET_US = 50.0
MAX_CALLS = 16
#: the input sets of a multi-call sample together stay below this (they are the cell's inputs `calls` times)
MAX_SETS_BYTES = 1 << 30
#: the spin before a graph replay only has to outlast one graph launch on the host (an eager call launches every
#: kernel of the call), and the flush queued before it (~85 us on the H200) covers the host too, since the host
#: no longer waits for it: a sample whose spin ended before the host had launched the replay is taken again, with a
#: spin 4x longer. Was 100 us with a device sync after the flush; the GPU then idled for that sync's round trip
#: and ran 80 us more of spin per sample, which a microsecond cell's hundreds of samples paid for
GRAPH_SPIN_US = 20.0

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
            self.graph_spin_cycles = max(1000, int(self.spin_cycles * GRAPH_SPIN_US / SPIN_US))

    def _calibrate(self) -> int:
        """Spin cycles that keep the GPU busy for at least SPIN_US at its highest clock.

        The spin kernel counts clock cycles, so its length in time follows the SM clock, which an
        idle GPU drops (an idle H200 sat at 345 of 1980 MHz). Calibrated cold, the spin came out
        ~6x too short once the clock rose, host launch time leaked into the event window, and the
        rmsnorm root timed 80-150 us instead of 4 (benchmarks/results/archive/evaluator_h200_badspin.md).
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

    def sample(self, fn, graph: bool = False) -> tuple[Any, float, float]:
        """(output, event µs, wall µs). On the CPU both times are the host wall time. `graph`: fn replays a CUDA
        graph, so a short spin hides its launch; a sample whose spin had ended when the host was done launching
        (its window then holds host time) is taken again, with a spin 4x longer, up to three times."""
        if not self.cuda:
            t0 = _perf()
            out = fn()
            us = (_perf() - t0) * 1e6
            return out, us, us
        cycles = self.graph_spin_cycles if graph else self.spin_cycles
        for _ in range(4 if graph else 1):
            self.flush.zero_()
            _spin(cycles)
            t0 = _perf()
            _record(self.start)
            out = fn()
            _record(self.end)
            covered = not self.start.query()
            _sync()
            wall = (_perf() - t0) * 1e6
            if covered:
                break
            cycles *= 4
        return out, _elapsed(self.start, self.end) * 1e3, wall

    def profile(self, fn) -> dict:
        """Kernels that ran during one eager call, on any stream, against that call's timed window.

        The window is bounded on the device by the harness's spin kernel before the call and a short marker spin
        queued after the end event, both on the timed stream: every kernel of the call must start after the
        spin ended and end before the marker started. Work on another stream that the timed stream does not
        wait for ends after the marker however small it is (both become ready when the spin ends); work that
        starts early overlaps the spin. The spin must still be running when the host has launched the whole call
        (else the window also covers the host's launch time, during which side work could finish unseen): the
        profiler slows launches down, so a spin too short is retried 4x longer, up to three times."""
        if not self.cuda:
            return {"error": "no profiler on cpu"}
        try:
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile

            cycles, covered = self.spin_cycles, False
            for _ in range(4):
                self.flush.zero_()
                _sync()
                # device activity only: the evidence reads kernels, and host ops are what a session spends its
                # time collecting and parsing (benchmarks/profile_cost.py)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    _spin(cycles)
                    _record(self.start)
                    fn()
                    _record(self.end)
                    covered = not self.start.query()  # the spin had not finished when the host was done
                    _spin(MARKER_CYCLES)
                    _sync()
                if covered:
                    break
                cycles *= 4
            window = _elapsed(self.start, self.end) * 1e3
            events = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                            key=lambda e: e.time_range.start)
            return window_evidence([(e.name, getattr(e, "device_resource_id", None), e.time_range.start,
                                     e.time_range.end) for e in events], window, covered)
        except Exception as e:  # a profiler that does not work here is reported, never fatal
            return {"error": f"{type(e).__name__}: {e}"[:200]}


def busy_us(events: list[tuple[str, Any, float, float]]) -> float:
    """Device time the kernels kept busy, stream by stream, summed over the streams: on one stream the union of the
    kernels' intervals, so that kernels a stream runs overlapped (programmatic dependent launch: the next kernel's
    programs start, and wait, while the one before finishes; linear's split and its combine, the decode step's
    launches) count once; kernels on two streams at once count on each. A call's busy time above its event window is
    then work the timed stream did not contain, as the plain sum was before PDL (H100, session 34: linear's root at
    M = 64, its main kernel and its combine, 49.3 us of kernels summed in a 38.4 us window, every tuner candidate
    failed on it: results/eval_rate_h100_s34.md)."""
    total, by_stream = 0.0, {}
    for e in events:
        by_stream.setdefault(e[1], []).append((e[2], e[3]))
    for spans in by_stream.values():
        end = None
        for a, b in sorted(spans):
            if end is None or a >= end:
                total += b - a
                end = b
            elif b > end:
                total += b - end
                end = b
    return float(total)


def window_evidence(events: list[tuple[str, Any, float, float]], window_us: float, covered: bool) -> dict:
    """Device activity (name, stream, start µs, end µs; sorted by start) of one profiled call, bounded by the
    harness's spin (the first spin kernel) and marker (the last kernel on the spin's stream, also a spin).
    `kernel_us` is the call's busy time (`busy_us`), `kernel_sum_us` its kernels' durations summed."""
    spin = next((i for i, e in enumerate(events) if "spin" in e[0].lower()), None)
    if spin is None:
        return {"kernels": len(events), "kernel_us": busy_us(events),
                "kernel_sum_us": float(sum(e[3] - e[2] for e in events)),
                "window_us": float(window_us), "overlap_spin": 0, "escaped": 0, "saw_spin": False,
                "saw_marker": False, "spin_covered": covered, "streams": 0}
    stream = events[spin][1]
    # the marker: the last kernel on the spin's stream (on any stream where the profiler reports none)
    later = [i for i, e in enumerate(events) if i != spin and (stream is None or e[1] == stream)]
    marker = later[-1] if later and "spin" in events[later[-1]][0].lower() else None
    if stream is None and marker is None:
        spins = [i for i in later if "spin" in events[i][0].lower()]
        marker = spins[-1] if spins else None
    s0, s1 = events[spin][2], events[spin][3]
    m0 = events[marker][2] if marker is not None else None
    call = [e for i, e in enumerate(events) if i not in (spin, marker)]
    # µs: every stream's timestamps come from one device clock, and a kernel the timed stream waited for ends
    # before the marker starts; the slack only absorbs rounding
    slack = 0.05
    return {"kernels": len(call), "kernel_us": busy_us(call), "kernel_sum_us": float(sum(e[3] - e[2] for e in call)),
            "window_us": float(window_us),
            "overlap_spin": sum(1 for e in call if e[2] < s1 - slack and e[3] > s0),
            "escaped": sum(1 for e in call if m0 is not None and e[3] > m0 + slack),
            "saw_spin": True, "saw_marker": marker is not None, "spin_covered": covered,
            "streams": len({e[1] for e in call})}


def run_timing_job(workdir: Path, job: dict, imported: dict[str, Any] | None = None) -> dict:
    """`imported`: implementations this process has already imported, by name (the candidate, after its probes
    in the same child: `child.await_next`); the others are imported here, in the order given."""
    device = job["device"]
    cmod = load_module(job["contract_file"], "tik_contract")
    contract = next(v for v in vars(cmod).values() if isinstance(v, Contract) and v.op == job["op"])
    cells = {c.name: c for c in contract.cells(job["profile"])}
    # trusted implementations are imported before the candidate, in the order given (unless the candidate was
    # imported for its probes already: the parent's checks of root and incumbent never rested on the order)
    mods, errors = {}, {}
    for name, path in job["impls"]:
        if imported and name in imported:
            mods[name] = imported[name]
            continue
        try:
            mods[name] = load_module(path, f"tik_{name}")
        except BaseException as e:  # noqa: B036
            errors[name] = "import failed: " + one_line(e)
    timer = Timer(device)
    w = TensorWriter(workdir / "out" / "outputs.bin", keep=False)  # a cell's outputs go with the cell
    doc: dict = {"import_errors": errors, "cells": {}, "floor_us": None, "spin_us": getattr(timer, "spin_us", None)}
    if timer.cuda and job.get("compile_ahead"):
        # every implementation's kernels at every cell's shapes (and at the rows computed again), compiled first on
        # all cores at once: the root's and incumbent's here too (this child's cache is a copy of the trusted one,
        # which holds their kernels at the probes' shapes, not at the cells')
        doc["ahead"] = _AHEAD.compile_ahead(_dry_cells(contract, cells, mods, job))
    floor = [timer.sample(lambda: None)[1] for _ in range(job["reps"])]
    profiled_root: list[str] = []
    doc["floor_us"] = statistics.median(floor)
    for cname in job["cells"]:
        try:
            doc["cells"][cname] = _time_cell(contract, cells[cname], mods, job, timer, w, check_outputs,
                                             flatten_outputs, profiled_root)
        except Exception as e:
            # out of memory: what held it, first (the parent keeps an error's first 300 characters)
            held = _held_on_device() if isinstance(e, torch.cuda.OutOfMemoryError) else ""
            doc["cells"][cname] = {"error": (f"out of memory; held: {held}; " if held else "") + one_line(e)}
    doc["tensors"] = w.close()
    return doc


def _held_on_device(min_bytes: int = 256 << 20, most: int = 6, device_type: str = "cuda") -> str:
    """The device memory this process's Python objects still reach, largest first, by dtype and shape: "3 x
    bfloat16[128, 8, 32768, 128] 24.0 GiB, ...", storages of at least `min_bytes` each counted once. Said when a cell
    runs out of memory (an attention timing on an H100 held 9 GiB no one could name: docs/MEASUREMENTS.md, session
    36); memory only C++ holds (a CUDA graph's pool, autograd's saved tensors) is not seen."""
    import gc
    import warnings

    whole: dict[int, tuple[int, int, str]] = {}  # storage -> (bytes, elements, label of its largest tensor)
    with warnings.catch_warnings():  # isinstance on some of torch's deprecated module attributes warns
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            # a dead weak proxy raises ReferenceError at isinstance, a tensor half torn down or a subclass that
            # refuses its own: not worth the diagnosis
            try:
                if not isinstance(o, torch.Tensor) or o.device.type != device_type:
                    continue
                st = o.untyped_storage()
                if st.nbytes() < min_bytes:
                    continue
                key, n = st.data_ptr(), o.numel()
                if key not in whole or n > whole[key][1]:  # a view of it is named by the tensor it is a view of
                    whole[key] = (st.nbytes(), n, f"{str(o.dtype).removeprefix('torch.')}{list(o.shape)}")
            except Exception:
                continue
    groups: dict[str, list[int]] = {}
    for nbytes, _, label in whole.values():
        g = groups.setdefault(label, [0, 0])
        g[0], g[1] = g[0] + 1, g[1] + nbytes
    top = sorted(groups.items(), key=lambda kv: -kv[1][1])[:most]
    return ", ".join(f"{n} x {label} {b / 2**30:.1f} GiB" for label, (n, b) in top)


def _dry_cells(contract, cells: dict, mods: dict, job: dict) -> list:
    """One call per cell (`ahead.record`'s dry run): the cell's first input variant built, then each implementation
    called on it and on its first row and first ROWS_BATCH rows (the shapes `_rows_again` calls). An implementation
    that raises here is skipped; the real pass reports it."""
    seed = variant_seeds(job["seed"], job["variants"])[0]

    def call(cell) -> None:
        case = contract.bench_case(cell, seed, job["device"])
        shapes = [case.args]
        if case.token_args and job.get("rows_check", True):
            first = case.args[case.token_args[0]]
            for k in sorted({1, min(ROWS_BATCH, first.shape[0])} - {first.shape[0]}):
                idx = torch.arange(k, device=first.device)
                shapes.append(_rows_of(case, idx))
        for m in mods.values():
            fn = getattr(m, case.entry, None)
            for args in shapes if callable(fn) else ():
                try:
                    fn(*args, **case.kwargs)
                except Exception:
                    break

    return [(lambda c=cells[name]: call(c)) for name in job["cells"]]


def variant_pools(contract, cell, seeds: list[int], device: str) -> tuple[Any, list[list[torch.Tensor]]]:
    """The case of the first seed (its tensors are the set the calls read) and every seed's inputs, copied into the
    set before a sample (`load` in `_time_cell`): the first seed's a copy of the set, the others the tensors their
    cases were built with (a copy only of one that shares storage with the set). A cell's inputs are then held
    1 + len(seeds) times, where building every case and then a copy of each held them 2 x len(seeds) + 1 times at
    the peak (H100, 80 GB: attention's decode at B = 128, L = 32768, 17 GB of KV a seed, ran out of memory, and every
    candidate's evaluation failed: results/eval_rate_h100_s34.md)."""
    case = contract.bench_case(cell, seeds[0], device)
    first = tensors_of(case.args, case.kwargs)
    live = {t.untyped_storage().data_ptr() for t in first}
    pools = [[t.clone() for t in first]]
    for sd in seeds[1:]:
        c = contract.bench_case(cell, sd, device)
        pools.append([t.clone() if t.untyped_storage().data_ptr() in live else t for t in tensors_of(c.args, c.kwargs)])
    return case, pools


def _time_cell(contract, cell, mods, job, timer: Timer, w, check_outputs, flatten_outputs,
               profiled_root: list[str]) -> dict:
    """`profiled_root`: the cell whose timing profiled the root, once per run (empty before)."""
    t_start = time.perf_counter()
    device = job["device"]
    n_variants = variants_of(cell, job["variants"])
    seeds = variant_seeds(job["seed"], n_variants)
    case, pools = variant_pools(contract, cell, seeds, device)
    # the input sets a sample calls on: call k of a sample reads set k, which holds variant (v + k) mod len(pools)
    sets = [tensors_of(case.args, case.kwargs)]

    def load(v: int) -> None:
        dst = [b for bufs in sets for b in bufs]
        src = [p for k in range(len(sets)) for p in pools[(v + k) % len(pools)]]
        if len(dst) != len(src):
            raise RuntimeError("input sets and variant pools differ in length")
        torch._foreach_copy_(dst, src)  # one launch for every set (a copy_ each cost ~5 us of host per tensor)

    fns: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, m in mods.items():
        fn = getattr(m, case.entry, None)
        if callable(fn):
            entries[name] = fn
            fns[name] = (lambda fn=fn: fn(*case.args, **case.kwargs))
        else:
            errors[name] = f"entry point {case.entry}() missing"
    if case.baseline is not None and job.get("baseline", True):
        fns["baseline"] = case.baseline
    keep = set(job.get("return_outputs", ()))
    samples: dict[str, dict[str, list]] = {n: {"event_us": [], "wall_us": []} for n in fns}
    outs: dict[str, list] = {n: [None] * len(pools) for n in fns if n in keep}
    timed: dict[str, Any] = dict(fns)  # what a timed sample calls: the eager call, or its CUDA graph's replay

    def guarded(name: str, v: int, timed_call: bool) -> list:
        """The outputs of one sample's calls, call k's on input set k."""
        load(v)
        if timed_call:
            out, ev, wall = timer.sample(timed[name], graph=name in graphs)
            samples[name]["event_us"].append(ev / calls)
            samples[name]["wall_us"].append(wall / calls)
        else:
            out = fns[name]()
        per_call = out if timed_call and calls > 1 else [out]
        # a graph's replay returns the tensors its capture returned, checked once then (`checked_graph_outputs`)
        if name != "baseline" and not (timed_call and name in graphs):
            for o in per_call:
                check_outputs(o, case.args, case.kwargs, device)
        return per_call

    def drop(name: str, e: BaseException | str) -> None:
        errors[name] = e if isinstance(e, str) else one_line_(e)
        for table in (fns, timed, samples, outs):
            table.pop(name, None)

    marks = {"inputs": time.perf_counter()}
    for name in list(fns):
        try:
            for _ in range(job["warmup"]):
                for v in range(len(pools)):
                    guarded(name, v, timed_call=False)
        except Exception as e:
            drop(name, e)
    if timer.cuda:
        torch.cuda.synchronize()
    marks["warm_calls"] = time.perf_counter()
    mode, graphs, why, calls, extra = "eager", {}, None, 1, []
    instances: list[dict] = [graphs]  # a microsecond cell's graphs, captured several times (`_more_instances`)
    turn = [0]  # the timed round: round r replays instance r mod len(instances) of every implementation
    if timer.cuda and job.get("graphs", True):
        mode, graphs, why = _capture_all(fns, load, drop)
        instances = [graphs]
        if mode == "graph" and "root" in graphs:
            calls = _calls_per_sample(timer, graphs["root"], load, sets[0])
        if calls > 1:
            # the extra input sets, and variants enough that the calls of one sample read distinct ones
            graphs.clear()
            seeds = variant_seeds(job["seed"], max(len(pools), calls))
            extra = [contract.bench_case(cell, sd, device) for sd in seeds[1:calls]]
            pools += [[t.clone() for t in tensors_of(c.args, c.kwargs)] for c in extra[len(pools) - 1:]]
            sets += [tensors_of(c.args, c.kwargs) for c in extra]
            multi = {name: _calls_of(name, entries, [case] + extra) for name in fns}
            mode, graphs, why = _capture_all(multi, load, drop)
            instances = [graphs]
            if mode != "graph":  # no worse than a single call: the cell is timed eagerly, one call per sample
                calls = 1
            else:
                instances = [graphs] + _more_instances(multi, load, drop, job.get("graph_instances", 1) - 1)
        for inst in instances:
            for name in list(inst):
                if name not in fns:  # dropped while another instance was captured
                    inst.pop(name)
                    continue
                problem = checked_graph_outputs(name, inst[name][1], calls, [case] + (extra if calls > 1 else []),
                                                device)
                if problem:
                    drop(name, problem)
        instances = [{n: gi for n, gi in inst.items() if n in fns} for inst in instances]
        graphs = instances[0]
        for name in graphs:
            timed[name] = (lambda name=name: _replay(instances[turn[0] % len(instances)][name]))
        for n in outs:
            outs[n] = [None] * len(pools)
    marks["capture"] = time.perf_counter()
    prof, eager, eager_s = {}, {}, 0.0
    if job.get("profile_kernels") and timer.cuda:
        # the root's profile only shows the profiler works here: once per run (`profiled_root`), not per cell
        for name in ("candidate",) + (() if profiled_root else ("root",)):
            if name in fns:
                load(0)
                prof[name] = timer.profile(fns[name])
                if name == "root":
                    profiled_root.append(cell.name)
                if mode == "graph" and name == "candidate":
                    t_eager = time.perf_counter()
                    load(0)
                    eager[name] = [timer.sample(fns[name])[1] for _ in range(EAGER_SAMPLES)]
                    eager_s += time.perf_counter() - t_eager
    rng = random.Random(job["seed"] ^ 0x5EED)
    # rounds: at least min_reps, then until every median is known to `precision` or the cell's time budget is
    # spent, at most reps; a round times every implementation once, so every implementation gets the same number
    # of samples
    min_reps, budget, precision = job.get("min_reps", job["reps"]), job.get("cell_budget_s"), job.get("precision")
    # a cell whose rounds take long_round_s or more (milliseconds of kernels a call) may stop from min_reps_long on
    min_long, long_round = job.get("min_reps_long", min_reps), job.get("long_round_s")
    t_timed, rounds = time.perf_counter(), 0
    marks["profile"] = t_timed
    last: dict[str, tuple[int, list]] = {}  # each implementation's last timed sample: (variant, outputs)
    for r in range(job["reps"]):
        spent = time.perf_counter() - t_timed
        least = min_long if long_round is not None and r and spent / r >= long_round else min_reps
        if r >= least and budget is not None and spent > budget:
            break
        if r >= least and precision and r % 5 == 0 and precise(samples, precision):
            break
        rounds += 1
        turn[0] = r
        v = r % len(pools)
        order = list(timed)
        rng.shuffle(order)
        for name in order:
            if name not in timed:
                continue
            try:
                per_call = guarded(name, v, timed_call=True)
            except Exception as e:
                drop(name, e)
                continue
            if name in outs and not (name in graphs and calls >= len(pools)):
                # a graph writes every replay into the same tensors: keep a copy (after the timed window)
                for k, out in enumerate(per_call):
                    outs[name][(v + k) % len(pools)] = ([t.clone() for t in flatten_outputs(out)] if name in graphs
                                                        else out)
            last[name] = (v, per_call)
    if timer.cuda:
        torch.cuda.synchronize()
    for name in outs:
        if name in graphs and calls >= len(pools) and name in last:
            # every sample covered every variant: the last round's outputs, still in the graph's tensors, are kept
            v, per_call = last[name]
            for k, out in enumerate(per_call):
                outs[name][(v + k) % len(pools)] = [t.clone() for t in flatten_outputs(out)]
    marks["timed"] = time.perf_counter()
    sent: dict[str, list] = {}
    picks: dict = {}  # one random row order per (variant, token count), shared by every output and implementation
    for name, per_v in outs.items():
        try:
            sent[name] = [[_send(t, w, picks, v) for t in flatten_outputs(o)]
                          for v, o in enumerate(per_v) if o is not None]
        except Exception as e:
            errors[name] = one_line_(e)
    rows = {}
    if case.token_args and job.get("rows_check", True):
        for name in outs:
            if name in entries and name not in errors:
                try:
                    rows[name] = _rows_again(entries[name], case, outs[name][:n_variants], load, picks, w,
                                             flatten_outputs)
                except Exception as e:
                    rows[name] = {"error": one_line_(e)}
    for inst in instances:
        inst.clear()  # the graphs' memory pools go with them
    graphs.clear()
    timed.clear()
    if timer.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return {"samples": samples, "errors": errors, "profile": prof, "outputs": sent, "seeds": seeds,
            "rounds": rounds, "timing": mode, "graph_note": why, "eager_us": eager, "rows": rows, "calls": calls,
            "instances": len(instances) if mode == "graph" else 0,
            "seconds": {"warmup": round(t_timed - t_start, 3), **_spans(t_start, marks),
                        "eager": round(eager_s, 3)}}  # the part of "profile" spent on the eager samples


def precise(samples: dict[str, dict[str, list]], precision: float) -> bool:
    """Every implementation's median event time known to within ±precision (relative): the half-width of the
    median's 95% interval, 1.57 x IQR / sqrt(n) (the notch of a box plot), over its median. The ratio of two such
    medians is then known to about ±1.4 x precision; the paired-bootstrap promotion rule sees the same rounds."""
    for s in samples.values():
        xs = s["event_us"]
        if len(xs) < 8:
            return False
        q = statistics.quantiles(xs, n=4)
        med = statistics.median(xs)
        if med <= 0 or 1.57 * (q[2] - q[0]) / math.sqrt(len(xs)) > precision * med:
            return False
    return True


def _spans(t0: float, marks: dict[str, float]) -> dict[str, float]:
    """Seconds of each part of a cell, from the time each part ended (in order), and of what followed the last."""
    out, prev = {}, t0
    for name, t in marks.items():
        out[name], prev = round(t - prev, 3), t
    out["after"] = round(time.perf_counter() - prev, 3)
    return out


def checked_graph_outputs(name: str, out: Any, calls: int, sets: list, device: str) -> str | None:
    """Why the outputs a graph's capture returned are unfit (every replay returns these tensors), or None."""
    if name == "baseline":
        return None
    try:
        for o, c in zip(out if calls > 1 else [out], sets, strict=True):
            check_outputs(o, c.args, c.kwargs, device)
    except Exception as e:
        return one_line_(e)
    return None


def _calls_per_sample(timer: Timer, root_graph, load, inputs: list[torch.Tensor]) -> int:
    """Calls per graph-replayed sample: the fewest (a power of two, at most MAX_CALLS) that make a sample of the root
    last SAMPLE_TARGET_US, its input sets together under MAX_SETS_BYTES. The estimate is the median of 3 replays
    of the root's one-call graph, which every contender's `calls` then follows."""
    g, out = root_graph
    times = []
    for _ in range(3):
        load(0)
        times.append(timer.sample(lambda: (g.replay(), out)[1], graph=True)[1])
    one = max(statistics.median(times), 1e-3)
    per_set = max(1, sum(t.numel() * t.element_size() for t in inputs))
    calls = 1
    while calls < MAX_CALLS and calls * one < SAMPLE_TARGET_US and 2 * calls * per_set <= MAX_SETS_BYTES:
        calls *= 2
    return calls


def _calls_of(name: str, entries: dict, sets: list) -> Any:
    """One sample's calls of an implementation (the stock baseline: its closure over each set's inputs), call k on
    set k, outputs as a list."""
    if name == "baseline":
        return lambda: [c.baseline() for c in sets]
    fn = entries[name]
    return lambda: [fn(*c.args, **c.kwargs) for c in sets]


def _replay(graph_and_out: tuple[Any, Any]) -> Any:
    graph, out = graph_and_out
    graph.replay()
    return out


def _more_instances(fns: dict, load, drop, n: int) -> list[dict]:
    """n more captures of every implementation's calls, each set of graphs with memory of its own. On the H200 the
    root timed against itself on the 2.3 us cells (16 calls a sample) came out up to 2.9% apart, and the sign
    followed which graph was which, not which implementation (benchmarks/results/evaluator_rvi_h200_*capture.md):
    a graph instance has a speed of its own there. Rounds rotate over the instances, so every implementation is
    timed over as many of them. A capture that fails here ends the list (the instances so far are used)."""
    out = []
    for _ in range(max(0, n)):
        mode, graphs, _ = _capture_all(fns, load, drop)
        if mode != "graph":
            break
        out.append(graphs)
    return out


def _capture(fn) -> tuple[Any, Any]:
    """A CUDA graph of one call (warmed up on a side stream first, as capture requires) and its output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    _sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    _sync()
    return graph, out


def _capture_all(fns: dict, load, drop) -> tuple[str, dict, str | None]:
    """("graph", graphs, None) when every implementation's call is captured: then every timed sample replays a
    graph, and work a call launches on a stream the capture does not join either fails the capture or is not
    in the graph (its output is then stale on the next input variant): nothing escapes the timing events,
    whatever its size. A trusted implementation (root, incumbent, stock PyTorch) that cannot be captured makes
    the cell eager for all, with the reason; a candidate that cannot be captured where they all can is dropped
    (it would be timed eagerly, where a side stream escapes the events)."""
    graphs, failed = {}, {}
    for name in list(fns):
        load(0)
        try:
            graphs[name] = _capture(fns[name])
        except Exception as e:
            failed[name] = one_line_(e)
            try:
                _sync()
            except Exception:  # a context the failed capture left unusable: the next call reports it
                pass
    trusted = [n for n in failed if n != "candidate"]
    if trusted:
        return "eager", {}, f"{trusted[0]} cannot be captured in a CUDA graph: {failed[trusted[0]]}"[:300]
    if "candidate" in failed:
        drop("candidate", "its call cannot be captured in a CUDA graph (every implementation of this cell is timed "
                          f"as a graph replay): {failed['candidate']}"[:300])
    return "graph", graphs, None


def _rows_again(fn, case, per_v: list, load, picks: dict, w, flatten_outputs) -> list[dict]:
    """Rows of each timed input variant computed again, after every timed call: ROWS_ALONE rows alone and up to
    ROWS_BATCH as one small batch, drawn from the rows sent back (so the parent has the timed rows to compare).
    A candidate that takes another path only at the timed token counts gives other bits here."""
    first = case.args[case.token_args[0]]
    T = first.shape[0]
    out = []
    for v, o in enumerate(per_v):
        if o is None:
            continue
        avail = _sent_rows(picks, v, T)
        load(v)
        for idx in [avail[k:k + 1] for k in range(min(ROWS_ALONE, len(avail)))] + [avail[:ROWS_BATCH]]:
            dev = idx.to(first.device)
            got = flatten_outputs(fn(*_rows_of(case, dev), **case.kwargs))
            out.append({"v": v, "rows": w.ref(idx.clone()), "outputs": [w.ref(t) for t in got]})
    return out


def _rows_of(case, idx: torch.Tensor) -> tuple:
    """The case's arguments with only rows `idx` of its token arguments."""
    return tuple(a[idx] if i in case.token_args else a for i, a in enumerate(case.args))


def _sent_rows(picks: dict, v: int, T: int) -> torch.Tensor:
    """Rows of variant v that every output was sent back with, in a random order (any of the T when sent whole):
    the first k of the variant's row order, k the fewest an output sent."""
    perm = picks[(v, T)] if (v, T) in picks else torch.randperm(T, generator=_urandom_gen())
    ks = [key[2] for key in picks if len(key) == 3 and key[:2] == (v, T)]
    return perm[:min(ks, default=T)]


def _urandom_gen() -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def _send(t: torch.Tensor, w, picks: dict, v: int) -> dict:
    """A timed output, whole, or (when huge) a subset of rows drawn now, after every call has returned. One
    random order of the T rows per (variant, T): an output sends the first k rows of it (sorted), so the rows
    a wide output sends are among those of a narrow one."""
    if t.numel() <= MAX_SENT_ELEMS or t.dim() == 0 or t.shape[0] < 2:
        return {"data": w.ref(t), "rows": None}
    T = t.shape[0]
    if (v, T) not in picks:
        picks[(v, T)] = torch.randperm(T, generator=_urandom_gen())
    k = max(1, min(T, MAX_SENT_ELEMS // max(1, t.numel() // T)))
    if (v, T, k) not in picks:
        idx = picks[(v, T)][:k].sort().values
        picks[(v, T, k)] = (idx, w.ref(idx))
    idx, ref = picks[(v, T, k)]
    return {"data": w.ref(t[idx.to(t.device)]), "rows": ref}


def one_line_(e: BaseException) -> str:
    return one_line(e)


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
