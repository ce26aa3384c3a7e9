"""The parent side of timing: run the harness child (and, on the GPU, a control child without the
candidate), turn samples into the report's cells, and judge the timed run — the candidate's timed outputs
against a reference computed here, and the evidence that its work ran inside its timed window."""

from __future__ import annotations

import hashlib
import inspect
import math
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tik_kernels.contract import CheckResult, Contract, bitwise_equal, error_stats, flatten_outputs, variants_of
from tik_kernels.evaluator import ahead as _AHEAD
from tik_kernels.evaluator import devlock
from tik_kernels.evaluator.checks import spec
from tik_kernels.evaluator.promotion import objective_ratio_ci
from tik_kernels.evaluator.protocol import ProtocolError, read_tensors, tensor_index
from tik_kernels.evaluator.report import EvalReport, fail
from tik_kernels.evaluator.sandbox import limits
from tik_kernels.evaluator.spawn import ChildOutcome, PhasedChild, run_child
from tik_kernels.evaluator.timing import MAX_CALLS, summarize, variant_seeds

#: a candidate's timed output must be this close (relative RMS) to the reference, at least
MIN_TIMED_BOUND = 0.05
#: the root may run at most this much slower beside the candidate than alone (control run)
NEIGHBOUR_SLOWDOWN = 1.15
#: the root and incumbent beside the candidate may run at most this much slower than alone over all cells together
#: (geometric mean of the per-cell ratios): a candidate in the same process that slows them a little everywhere gains
#: as much as its neighbour limit allows on every cell. On the H200 honest runs came out 0.995-1.009 over rmsnorm's 7
#: cells (evaluator_cheats_h200.json, evaluator_rvi_h200_*.json) while single cells ranged 0.92-1.14; a run past it
#: against a kept control run is judged again against a fresh one (the GPU may have drifted since)
NEIGHBOUR_SLOWDOWN_ALL = 1.03
#: the control run (root and incumbent alone) is reused for this long within one process
CONTROL_TTL_S = 600.0
_CONTROL_CACHE: dict[tuple, tuple[float, dict]] = {}
#: interleaved rounds per cell (each round times every implementation once). 100: on the H200 the
#: rmsnorm root against itself came out within 0.15% per cell at 100 rounds and 3.1% at 15
#: (benchmarks/results/evaluator_h200.md vs evaluator_h200_reps15.md); a round costs ~1.3 ms per
#: implementation (L2 flush + 1 ms spin), so 100 rounds of 7 cells x 4 implementations are ~4 s
GPU_REPS = 100
CPU_REPS = 5
#: past GPU_MIN_REPS rounds a cell stops once its rounds have taken CELL_BUDGET_S: a cell whose round is
#: over 10 ms (kernels of a millisecond and more, where a sample varies by well under 1%) gets fewer than
#: GPU_REPS rounds, the microsecond cells the 100 rounds were measured on keep all of them
GPU_MIN_REPS = 20
CELL_BUDGET_S = 1.0
#: a cell whose rounds take LONG_ROUND_S or more (a round times every implementation once: kernels of milliseconds,
#: linear at M = 16384, prefill at 16k tokens) may stop from GPU_MIN_REPS_LONG rounds on, when the precision rule
#: below holds there; on the H200 such a cell spent ~0.4 s on its 20 rounds (linear's 5 widest cells: 2 s of an
#: evaluation). Root against itself on every linear cell: `bench_evaluator_cheats.py --op linear`
GPU_MIN_REPS_LONG = 10
LONG_ROUND_S = 0.01
#: past GPU_MIN_REPS rounds a cell also stops once every implementation's median is known to ±this (relative;
#: `timing.precise`): root vs itself must stay within ±1% per cell at the rounds this leaves
#: (benchmarks/bench_evaluator_cheats.py)
GPU_PRECISION = 0.003
#: untimed rounds of eager calls (every input variant once a round) before a cell is captured and timed: one loads
#: every kernel and lets a library allocate what it allocates on a first call (a capture must not); the timed rounds
#: then start from graph replays, whose first samples are no different from the rest. Was 3 on the GPU: 0.4 s of
#: linear's and 1.1 s of attention's evaluation on the H200 (timing_cells_warm_calls), for nothing a sample showed
GPU_WARMUP = 1
#: a microsecond cell (several calls a sample) is captured this many times per implementation, rounds rotating over
#: the instances (`timing._more_instances`): one graph instance of identical code timed up to 2.9% off another
GPU_GRAPH_INSTANCES = 4
#: the parts of a timed cell the child reports seconds for (`timing._time_cell`): "warmup" is everything before the
#: timed rounds (inputs, warm-up calls, capture, profile), "after" the outputs sent back and the rows computed again;
#: "eager" is the part of "profile" spent on the candidate's eager samples (the rest: the profiled calls)
CELL_PARTS = ("warmup", "inputs", "warm_calls", "capture", "profile", "eager", "timed", "after")
#: the stock-PyTorch reference outputs of a timed cell's input variants are kept in this process (on the CPU) across
#: evaluations when the cell's variants' outputs together take at most REF_CELL_BYTES, up to REF_CACHE_BYTES in all
#: (least recently used out first). A reference depends only on (contract fingerprint, cell, variant seed, device),
#: and a search uses one seed, so it pays once for the many small cells (up to MAX_CALLS variants each, a bench case
#: and a baseline call apiece, and for attention decode a KV cache of GBs built for an output of KBs). Larger
#: references are computed again in every evaluation, on the device, and compared there: copying them to the host
#: and comparing in float64 on the CPU was most of the judge's time (a cell of 16384 tokens sends 4M-element samples)
REF_CELL_BYTES = 4 << 20
REF_CACHE_BYTES = 256 << 20
#: on the GPU a variant whose reference has at least this many elements is compared on the GPU (the timed data, a
#: row sample at most, copied there), a smaller one on the CPU (where a few kernel launches and syncs would cost
#: more than the arithmetic): the same float64 statistics either way
DEVICE_COMPARE_ELEMS = 1 << 16
_REF_CACHE: OrderedDict[tuple, tuple[list[torch.Tensor] | None, int]] = OrderedDict()
_REF_LOCK = threading.Lock()  # evaluations of one process may run in threads


def _contract_file(contract: Contract) -> str:
    return str(Path(inspect.getfile(contract.build_plan)).resolve())


def run_timing(contract: Contract, impls: list[tuple[str, Path]], *, device: str, profile: str, seed: int,
               timeout: float, return_outputs: tuple[str, ...] = (), profile_kernels: bool = False,
               reps: int | None = None, fixed_reps: bool = False,
               baseline: bool = True, cache: str = "seeded") -> tuple[dict | None, str | None]:
    """Time `impls` (name, file), interleaved, over every cell of `profile`, in one child.

    `reps` rounds per cell at most (default GPU_REPS / CPU_REPS); on the GPU a cell stops early after
    GPU_MIN_REPS once CELL_BUDGET_S is spent, unless `fixed_reps`. `baseline`: time stock PyTorch too.
    `cache`: the child's Triton cache on the GPU (`sandbox.triton_cache`; "candidate" when a candidate is timed)."""
    job, wall, read_result = timing_job(contract, impls, device=device, profile=profile, seed=seed, timeout=timeout,
                                        return_outputs=return_outputs, profile_kernels=profile_kernels, reps=reps,
                                        fixed_reps=fixed_reps, baseline=baseline)
    # a copy of the root's compiled kernels: the timing child never recompiles what the root's probes compiled; the
    # device alone meanwhile (`devlock`; a block of this thread's that holds it already, `core._quiet`, keeps it)
    with devlock.exclusive(device):
        outcome = run_child(job, lambda tmp: {}, read_result, wall,
                            cache=cache if device.startswith("cuda") else "private")
    return outcome.doc, outcome.failure


def timing_wall(timeout: float, n_cells: int, cuda: bool) -> float:
    """The wall-clock limit of a timing run (a child's check phase gets `timeout`)."""
    return 3 * timeout + (10 * n_cells if cuda else 0)


def timing_job(contract: Contract, impls: list[tuple[str, Path]], *, device: str, profile: str, seed: int,
               timeout: float, return_outputs: tuple[str, ...] = (), profile_kernels: bool = False,
               reps: int | None = None, fixed_reps: bool = False,
               baseline: bool = True) -> tuple[dict, float, Callable[[Path, dict], dict]]:
    """(job, wall-clock limit, reader of the reply) of a timing run (see `run_timing`): the job a timing child
    runs, or the second job of the candidate's own child (`time_candidate`)."""
    cuda = device.startswith("cuda")
    by_name = {c.name: c for c in contract.cells(profile)}
    cells = list(by_name)
    wall = timing_wall(timeout, len(cells), cuda)
    n_reps = reps or (GPU_REPS if cuda else CPU_REPS)
    early = cuda and not fixed_reps
    job = {"mode": "time", "op": contract.op, "contract_file": _contract_file(contract), "profile": profile,
           "seed": seed, "device": device, "impls": [[n, str(p.resolve())] for n, p in impls], "cells": cells,
           "reps": n_reps, "warmup": GPU_WARMUP if cuda else 1, "variants": 2,
           "min_reps": min(n_reps, GPU_MIN_REPS) if early else n_reps,
           "min_reps_long": min(n_reps, GPU_MIN_REPS_LONG) if early else n_reps,
           "long_round_s": LONG_ROUND_S if early else None,
           "cell_budget_s": CELL_BUDGET_S if early else None, "precision": GPU_PRECISION if early else None,
           "graph_instances": GPU_GRAPH_INSTANCES,
           "baseline": baseline,
           "return_outputs": list(return_outputs), "profile_kernels": profile_kernels, "limits": limits(wall),
           "compile_ahead": _AHEAD.ENABLED}

    def read_result(out: Path, doc: dict) -> dict:
        tensors = read_tensors(out / "outputs.bin", doc.get("tensors"))
        raw = doc.get("cells")
        if not isinstance(raw, dict) or set(raw) != set(cells):
            raise ProtocolError("timed cells do not match the cells asked for")
        parsed = {}
        for name, c in raw.items():
            if not isinstance(c, dict):
                raise ProtocolError(f"cell {name}: malformed")
            if "error" in c:
                parsed[name] = {"error": str(c["error"])[:300]}
                continue
            calls = c.get("calls", 1)
            if type(calls) is not int or not 1 <= calls <= MAX_CALLS:
                raise ProtocolError(f"cell {name}: calls per sample out of range")
            # a multi-call sample reads one variant per call (timing._calls_per_sample)
            if c.get("seeds") != variant_seeds(seed, max(variants_of(by_name[name], job["variants"]), calls)):
                raise ProtocolError(f"cell {name}: wrong input seeds")
            parsed[name] = {
                "samples": {str(k): {"event_us": _floats(v["event_us"]), "wall_us": _floats(v["wall_us"])}
                            for k, v in _dict(c["samples"]).items()},
                "errors": {str(k): str(v)[:300] for k, v in _dict(c["errors"]).items()},
                "profile": {str(k): _dict(v) for k, v in _dict(c["profile"]).items()},
                "outputs": {str(k): [[_sent(o, tensors, name) for o in per_v] for per_v in _list(v)]
                            for k, v in _dict(c["outputs"]).items()},
                "seeds": c["seeds"],
                "rounds": c.get("rounds") if type(c.get("rounds")) is int else None,
                "calls": calls,
                "instances": c["instances"] if type(c.get("instances")) is int else None,
                "timing": c.get("timing") if c.get("timing") in ("graph", "eager") else None,
                "graph_note": str(c["graph_note"])[:300] if c.get("graph_note") is not None else None,
                "eager_us": {str(k): _floats(v) for k, v in _dict(c.get("eager_us", {})).items()},
                "rows": {str(k): _rows(v, tensors, name) for k, v in _dict(c.get("rows", {})).items()},
                "seconds": {k: float(v) for k, v in _dict(c.get("seconds", {})).items()
                            if k in CELL_PARTS and type(v) in (int, float) and math.isfinite(v)},
            }
        floor = doc.get("floor_us")
        told = doc.get("ahead") if isinstance(doc.get("ahead"), dict) else {}
        return {"cells": parsed, "floor_us": float(floor) if isinstance(floor, (int, float)) else None,
                "import_errors": {str(k): str(v)[:300] for k, v in _dict(doc.get("import_errors", {})).items()},
                # what the child says it compiled ahead (`timing._dry_cells`): diagnostics, never used to decide
                "ahead": {k: float(told[k]) for k in ("s", "kernels", "failed")
                          if type(told.get(k)) in (int, float) and 0 <= told[k] < 1e5}}

    return job, wall, read_result


def _dict(x: Any) -> dict:
    if not isinstance(x, dict):
        raise ProtocolError("expected an object")
    return x


def _list(x: Any) -> list:
    if not isinstance(x, list) or len(x) > 4096:
        raise ProtocolError("expected a list")
    return x


def _sent(o: Any, tensors: list[torch.Tensor], what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(data, rows): a whole timed output (rows None) or the rows `rows` of it."""
    if not isinstance(o, dict) or set(o) != {"data", "rows"}:
        raise ProtocolError(f"{what}: malformed timed output")
    data = tensors[tensor_index(o["data"], len(tensors), what)]
    if o["rows"] is None:
        return data, None
    rows = tensors[tensor_index(o["rows"], len(tensors), what)]
    if rows.dtype != torch.int64 or rows.dim() != 1 or data.dim() == 0 or data.shape[0] != rows.numel():
        raise ProtocolError(f"{what}: malformed row sample")
    return data, rows


def _rows(x: Any, tensors: list[torch.Tensor], what: str) -> list[dict] | dict:
    """Timed rows recomputed by the child: [{v, rows (int64 row indices), outputs}] or {"error": ...}."""
    if isinstance(x, dict) and set(x) == {"error"}:
        return {"error": str(x["error"])[:300]}
    out = []
    for r in _list(x):
        if not isinstance(r, dict) or set(r) != {"v", "rows", "outputs"} or type(r["v"]) is not int:
            raise ProtocolError(f"{what}: malformed recomputed rows")
        rows = tensors[tensor_index(r["rows"], len(tensors), what)]
        if rows.dtype != torch.int64 or rows.dim() != 1:
            raise ProtocolError(f"{what}: malformed row indices")
        out.append({"v": r["v"], "rows": rows,
                    "outputs": [tensors[tensor_index(i, len(tensors), what)] for i in _list(r["outputs"])]})
    return out


def _floats(x: Any) -> list[float]:
    if not isinstance(x, list) or len(x) > 100_000:
        raise ProtocolError("expected a list of samples")
    out = []
    for v in x:
        if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
            raise ProtocolError("a timing sample is not a finite non-negative number")
        out.append(float(v))
    return out


def candidate_timing_job(contract: Contract, cand_path: Path, root_path: Path, incumbent_path, device: str,
                         profile: str, seed: int, timeout: float) -> tuple[dict, float, Callable[[Path, dict], dict]]:
    """The timing run of a candidate: root (and incumbent) beside it, interleaved; see `timing_job`."""
    cuda = device.startswith("cuda")
    return timing_job(contract, _trusted(root_path, incumbent_path) + [("candidate", cand_path)], device=device,
                      profile=profile, seed=seed, timeout=timeout, return_outputs=("candidate", "root"),
                      profile_kernels=cuda, baseline=not cuda)


def _trusted(root_path: Path, incumbent_path) -> list[tuple[str, Path]]:
    return [("root", root_path)] + ([("incumbent", Path(incumbent_path))] if incumbent_path else [])


def time_candidate(report: EvalReport, contract: Contract, cand_path: Path, root_path: Path, incumbent_path,
                   device: str, timeout: float, phased: PhasedChild | None = None,
                   outcome: ChildOutcome | None = None) -> None:
    """Time a verified candidate and judge the run. `phased`: the candidate's own child, waiting after its probes
    (its second job is `candidate_timing_job`); else a timing child of its own. `outcome`: that child's timing,
    already run (while the parent checked the probes: `core.OVERLAP_CHECKS`); only judged here."""
    cuda = device.startswith("cuda")
    report.timing = "gpu" if cuda else "interpreter"
    trusted = _trusted(root_path, incumbent_path)
    t = time.monotonic()
    if outcome is None:
        job, wall, read_result = candidate_timing_job(contract, cand_path, root_path, incumbent_path, device,
                                                      report.profile, report.seed, timeout)
        outcome = (phased.then(read_result, wall) if phased is not None else
                   run_child(job, lambda tmp: {}, read_result, wall, cache="candidate" if cuda else "private"))
    else:
        t -= outcome.elapsed_s
    doc, failure = outcome.doc, outcome.failure
    report.phases["timing_child"] = time.monotonic() - t
    for k in ("exit", "read"):  # inside timing_child: the child's exit after its reply, the parent's read of it
        if k in outcome.phases:
            report.phases[f"timing_{k}"] = outcome.phases[k]
    if failure:
        return fail(report, "timing/run", "timed_outputs", f"timing run: {failure}")
    for part in CELL_PARTS:  # as the child reports them: diagnostics, never used to decide
        report.phases[f"timing_cells_{part}"] = sum(c.get("seconds", {}).get(part, 0.0)
                                                    for c in doc["cells"].values())
    for k, v in doc.get("ahead", {}).items():
        report.phases["timing_ahead" if k == "s" else f"timing_ahead_{k}"] = v
    errs = doc["import_errors"]
    if "candidate" in errs:
        return fail(report, "timing/run", "timed_outputs", f"timing run: {errs['candidate']}")
    if errs:
        raise RuntimeError(f"timing run: {'; '.join(f'{k} {v}' for k, v in errs.items())}")
    control, slowed = None, None
    if cuda:
        key = (tuple((n, hashlib.sha256(p.read_bytes()).hexdigest()) for n, p in trusted), report.contract_fingerprint,
               tuple(c.name for c in contract.cells(report.profile)), report.profile, report.seed, device, GPU_REPS)

        def fresh_control() -> dict:
            t = time.monotonic()
            # the root's timed outputs and rows computed again come back too: whether a cell is token-wise as its
            # bench case says is then learnt from the root alone, in a trusted child (`timed_rows_ok`)
            run, failure = run_timing(contract, trusted, device=device, profile=report.profile, seed=report.seed,
                                      timeout=timeout, return_outputs=("root",), profile_kernels=True)
            report.phases["control_child"] = report.phases.get("control_child", 0.0) + time.monotonic() - t
            if failure:
                raise RuntimeError(f"control timing run: {failure}")
            _CONTROL_CACHE.clear()
            _CONTROL_CACHE[key] = (time.monotonic(), run)
            return run

        hit = _CONTROL_CACHE.get(key)
        kept = hit is not None and time.monotonic() - hit[0] < CONTROL_TTL_S
        control = hit[1] if kept else fresh_control()
        slowed = neighbours_slowed(doc, control)
        if kept and slowed is not None and slowed > NEIGHBOUR_SLOWDOWN_ALL:
            control = fresh_control()
            slowed = neighbours_slowed(doc, control)
    report.floor_us = doc["floor_us"]
    outputs_check, integrity = _TimedChecks("timing/outputs", "timed_outputs"), _TimedChecks(
        "timing/integrity", "timing_integrity")
    rows_check = _TimedChecks("timing/rows", "timed_rows")
    bound = max([MIN_TIMED_BOUND] + [4 * t.rel_rms for t in contract.tolerances.values()])
    root_profile = next((c["profile"]["root"] for c in doc["cells"].values() if c.get("profile", {}).get("root")),
                        None)
    # the root profiled alone, in the control run: whether the profiler works here (`integrity_ok`)
    trusted_profile = next((c["profile"]["root"] for c in (control or {}).get("cells", {}).values()
                            if c.get("profile", {}).get("root")), None)
    t_judge = time.monotonic()
    for cell in contract.cells(report.profile):
        c = doc["cells"][cell.name]
        if "error" in c:
            raise RuntimeError(f"timing cell {cell.name}: {c['error']}")
        if "candidate" in c["errors"]:
            outputs_check.fail(cell.name, f"the candidate failed while timed: {c['errors']['candidate']}")
            report.cells.append(_cell_row(cell, c, None))
            continue
        if "root" in c["errors"]:
            raise RuntimeError(f"timing cell {cell.name}: root: {c['errors']['root']}")
        outputs_check.add(cell.name, timed_outputs_ok(contract, cell, c, device, bound, report.contract_fingerprint))
        rows_check.add(cell.name, timed_rows_ok(c, control["cells"][cell.name] if control else None))
        if cuda:
            integrity.add(cell.name, integrity_ok(c, control["cells"][cell.name], root_profile, trusted_profile))
        report.cells.append(_cell_row(cell, c, control["cells"][cell.name] if control else None))
    if slowed is not None and slowed > NEIGHBOUR_SLOWDOWN_ALL:
        integrity.fail("all cells", f"the root and incumbent ran {slowed:.3f}x slower beside the candidate than "
                                    f"alone (geometric mean over the cells; at most {NEIGHBOUR_SLOWDOWN_ALL})")
    report.checks.append(outputs_check.result())
    report.checks.append(rows_check.result())
    if cuda:
        report.checks.append(integrity.result())
    report.objective_ci = paired_ci(contract, report, doc)
    report.phases["judge"] = time.monotonic() - t_judge  # the parent's checks of the timed run


def paired_ci(contract: Contract, report: EvalReport, doc: dict) -> list[float] | None:
    """The objective ratio's interval over paired rounds (candidate vs incumbent, the root where none)."""
    paired = []
    for cell in contract.cells(report.profile):
        s = doc["cells"][cell.name].get("samples", {})
        inc = "incumbent" if "incumbent" in s else "root"
        if "candidate" not in s or inc not in s:
            return None
        paired.append((cell.coeff, s["candidate"]["event_us"], s[inc]["event_us"]))
    ci = objective_ratio_ci(paired, seed=report.seed)
    return [round(ci[0], 6), round(ci[1], 6)] if ci is not None else None


class _TimedChecks:
    """One check aggregated over the cells: passes if every cell passed; the first failing cell is the detail."""

    def __init__(self, name: str, requirement: str):
        self.name, self.requirement, self.bad, self.n, self.notes = name, requirement, None, 0, []

    def add(self, cell: str, verdict: tuple[bool, str]) -> None:
        ok, detail = verdict
        if ok:
            self.n += 1
            if detail.startswith("skipped"):
                self.notes.append(f"{cell}: {detail}")
        else:
            self.fail(cell, detail)

    def fail(self, cell: str, detail: str) -> None:
        if self.bad is None:
            self.bad = f"{cell}: {detail}"

    def result(self) -> CheckResult:
        if self.bad is not None:
            return CheckResult(self.name, self.requirement, False, self.bad[:300])
        note = f" ({len(self.notes)} skipped: {self.notes[0]})" if self.notes else ""
        return CheckResult(self.name, self.requirement, True, f"{self.n} cells passed{note}"[:300])


def _cell_row(cell, c: dict, control: dict | None) -> dict:
    s = c["samples"]
    cand = summarize(s.get("candidate", {}).get("event_us", []))
    root = summarize(s.get("root", {}).get("event_us", []))
    inc = summarize(s["incumbent"]["event_us"]) if "incumbent" in s else root
    wall = summarize(s.get("candidate", {}).get("wall_us", []))
    med = cand["median_us"]
    vs_root = med / root["median_us"] if med is not None and root["median_us"] else None
    if "baseline" in s:  # timed beside the candidate (the CPU)
        base = summarize(s["baseline"]["event_us"])["median_us"]
        vs_base = med / base if med is not None and base else None
    else:
        # on the GPU stock PyTorch is timed in the control run only (a quarter less of every candidate's timed
        # rounds): the ratio is chained through the root, each factor from one run (candidate/root beside each
        # other, root/stock in the control run), never a time of one run over a time of another
        cs = (control or {}).get("samples", {})
        base = summarize(cs["baseline"]["event_us"])["median_us"] if "baseline" in cs else None
        alone = summarize(cs["root"]["event_us"])["median_us"] if "root" in cs else None
        vs_base = vs_root * alone / base if vs_root is not None and alone and base else None
    row = {
        "cell": cell.name, "coeff": cell.coeff, "limit": cell.limit,
        "median_us": med, "spread_us": cand["spread_us"], "samples": cand["samples"],
        "root_median_us": root["median_us"], "incumbent_median_us": inc["median_us"],
        "baseline_median_us": base,
        "ratio_vs_root": vs_root,
        "ratio_vs_baseline": vs_base,
        "root_spread_us": root["spread_us"], "wall_median_us": wall["median_us"], "rounds": c.get("rounds"),
        "timing": c.get("timing"), "calls": c.get("calls", 1), "graph_instances": c.get("instances"),
        "seconds": c.get("seconds", {}),  # where the child's time on this cell went (diagnostics, never decides)
    }
    if c.get("graph_note"):
        row["graph_note"] = c["graph_note"]
    if control is not None and "samples" in control and "root" in control["samples"]:
        row["root_alone_median_us"] = summarize(control["samples"]["root"]["event_us"])["median_us"]
    return row


def close_to(outs: list, refs: list[torch.Tensor], bound: float) -> tuple[bool, str]:
    """Timed outputs (tensors, or (data, rows) pairs) against reference tensors, loosely (see MIN_TIMED_BOUND).
    Compared where the reference is: a reference left on the GPU gets the timed data (a row sample at most) sent
    there, instead of the whole reference coming to the host."""
    if len(outs) != len(refs):
        return False, f"{len(outs)} outputs, reference has {len(refs)}"
    worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if isinstance(o, tuple):
            o, rows = o
            if rows is not None:
                if r.dim() == 0 or (rows.numel() and (int(rows.max()) >= r.shape[0] or int(rows.min()) < 0)):
                    return False, f"output {k}: row sample outside the output"
                r = r[rows.to(r.device)]
        if o.shape != r.shape or o.dtype != r.dtype:
            return False, f"output {k} is {spec(o)}, reference {spec(r)}"
        o = o.to(r.device)
        if o.is_floating_point():
            rel = rel_rms(o, r)
            if not rel <= bound:
                return False, f"output {k}: rel_rms {rel:.3g} from the reference (bound {bound:g})"
            worst = max(worst, rel)
        else:
            frac = float((o == r).double().mean()) if o.numel() else 1.0
            if frac < 0.99:
                return False, f"output {k}: only {frac:.1%} of elements equal to the reference"
    return True, f"rel_rms <= {worst:.3g}"


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """`error_stats(out, ref)[1]`: the same float64 reductions, read back with one host sync (a reference on the GPU
    would otherwise wait on the device once a reduction)."""
    return error_stats(out, ref)[1]


def timed_outputs_ok(contract: Contract, cell, c: dict, device: str, bound: float,
                     fingerprint: str | None = None) -> tuple[bool, str]:
    """The outputs of the candidate's timed calls, per input variant, against a reference computed here:
    the stock-PyTorch baseline when the root's timed outputs agree with it, else the root's timed outputs.
    `fingerprint`: the contract's; with it, small references are kept across evaluations (`REF_CELL_BYTES`)."""
    cand = c["outputs"].get("candidate", [])
    root = c["outputs"].get("root", [])
    seeds = c["seeds"]
    if len(cand) != len(seeds):
        return False, f"{len(cand)} timed outputs for {len(seeds)} input variants"
    computed = False
    for v, s in enumerate(seeds):
        base, fresh = reference(contract, cell, s, device, fingerprint, len(seeds))
        computed |= fresh
        base = _compare_on(base, device)
        refs, what = None, "root's timed output"
        if base is not None and v < len(root) and close_to(root[v], base, bound)[0]:
            refs, what = base, "stock-PyTorch output"
        outs = cand[v]
        if refs is None:
            if v >= len(root) or len(root[v]) != len(outs):
                return False, "no reference for the timed outputs"
            # the root's outputs went through the same row sample: compare the sampled data directly
            if any((a[1] is None) != (b[1] is None) or (a[1] is not None and not torch.equal(a[1], b[1]))
                   for a, b in zip(outs, root[v], strict=True)):
                return False, "timed outputs sampled differently from the root's"
            refs, outs = _compare_on([d for d, _ in root[v]], device), [d for d, _ in outs]
        ok, detail = close_to(outs, refs, bound)
        del base, refs
        if not ok:
            return False, f"timed call on input variant {v} is wrong vs the {what}: {detail}"
    if computed and device.startswith("cuda"):
        torch.cuda.empty_cache()
    return True, f"timed outputs match the reference on {len(seeds)} input variants"


def _compare_on(refs: list[torch.Tensor] | None, device: str) -> list[torch.Tensor] | None:
    """`refs` where `close_to` compares them (see DEVICE_COMPARE_ELEMS)."""
    if refs is None:
        return None
    big = device.startswith("cuda") and sum(t.numel() for t in refs) >= DEVICE_COMPARE_ELEMS
    return [t.to(device if big else "cpu") for t in refs]


def reference(contract: Contract, cell, seed: int, device: str, fingerprint: str | None,
              n_variants: int) -> tuple[list[torch.Tensor] | None, bool]:
    """(outputs, computed now) of stock PyTorch on `cell`'s bench case for input variant `seed`; outputs None when
    the case has no baseline. Kept on the CPU across evaluations when `fingerprint` is given and the cell's
    `n_variants` references fit REF_CELL_BYTES; otherwise computed now and left on `device` (compared there)."""
    key = (fingerprint, cell.name, seed, device)
    if fingerprint:
        with _REF_LOCK:
            hit = _REF_CACHE.get(key)
            if hit is not None:
                _REF_CACHE.move_to_end(key)
                return hit[0], False
    case = contract.bench_case(cell, seed, device)
    base = None if case.baseline is None else [t.detach() for t in flatten_outputs(case.baseline())]
    del case
    size = sum(t.numel() * t.element_size() for t in base or [])
    if fingerprint and size * n_variants <= REF_CELL_BYTES:
        # a compact copy of its own: a baseline output may be a view that would keep the case's inputs alive
        base = None if base is None else [t.to("cpu", copy=True) for t in base]
        with _REF_LOCK:
            _REF_CACHE[key] = (base, size + 1024)  # 1 KB for the entry itself: a bound on entries without outputs
            total = sum(n for _, n in _REF_CACHE.values())
            while total > REF_CACHE_BYTES:
                total -= _REF_CACHE.popitem(last=False)[1][1]
    return base, True


def timed_rows_ok(c: dict, alone: dict | None = None) -> tuple[bool, str]:
    """Every shape that is timed is bit-checked: rows of the candidate's timed calls, recomputed alone and in a
    small batch after the timed rounds, must have the bits of the same rows of the timed call. The probes stop
    at a few thousand tokens; the timed cells go to 16384, and a candidate that switches algorithm above the
    largest probed count would otherwise be rewarded for speed on a path nobody checked. The root is held to
    the same: where it fails, the cell is not token-wise the way its bench case says, and the check is skipped.

    `alone`: the cell of the control run (the GPU's: root and incumbent timed in a trusted child), whose root
    rows then say whether the cell is token-wise. The root beside the candidate shares the candidate's process,
    which can rewrite it: a candidate that made the root's rows differ there would otherwise have its own rows
    check skipped. Root rows that match alone and differ beside the candidate fail it."""
    rows = c.get("rows", {})
    if "candidate" not in rows:
        return True, "skipped: the cell declares no token rows"
    root = rows.get("root")
    trusted = (alone or {}).get("rows", {}).get("root")
    if trusted is not None:
        ok, detail = _rows_match(trusted, alone["outputs"].get("root", []))
        if not ok:
            return True, f"skipped: the root's own rows differ, timed alone ({detail})"
    if root is not None:
        ok, detail = _rows_match(root, c["outputs"].get("root", []))
        if not ok and trusted is not None:
            return False, (f"the root's rows differ beside this candidate ({detail}) and not when the root "
                           "is timed alone: the candidate changed the root")
        if not ok:
            return True, f"skipped: the root's own rows differ ({detail})"
    return _rows_match(rows["candidate"], c["outputs"].get("candidate", []))


def _rows_match(again: list | dict, timed: list) -> tuple[bool, str]:
    if isinstance(again, dict):
        return False, f"recomputing timed rows failed: {again['error']}"
    n = 0
    for r in again:
        if r["v"] >= len(timed) or len(r["outputs"]) != len(timed[r["v"]]):
            return False, f"{len(r['outputs'])} outputs recomputed, the timed call of variant {r['v']} had " + (
                f"{len(timed[r['v']])}" if r["v"] < len(timed) else "none")
        idx = r["rows"]
        for k, (got, (data, sent)) in enumerate(zip(r["outputs"], timed[r["v"]], strict=True)):
            if sent is None:
                if data.dim() == 0 or (idx.numel() and (int(idx.max()) >= data.shape[0] or int(idx.min()) < 0)):
                    return False, f"output {k}: recomputed rows outside the timed output"
                want = data[idx]
            else:
                pos = torch.searchsorted(sent, idx).clamp_max(max(sent.numel() - 1, 0))
                if sent.numel() == 0 or not torch.equal(sent[pos], idx):
                    return False, f"output {k}: recomputed rows were not among the rows sent back"
                want = data[pos]
            ok, detail, _ = bitwise_equal(got, want, f"output {k}") if got.dtype == want.dtype and \
                got.shape == want.shape else (False, f"output {k} is {spec(got)}, timed rows {spec(want)}", None)
            if not ok:
                how = "alone" if idx.numel() == 1 else f"as a batch of {idx.numel()}"
                return False, (f"timed rows {idx.tolist()[:8]} of input variant {r['v']}, computed again {how}, "
                               f"differ from the same rows of the timed call: {detail}")
        n += 1
    return True, f"{n} recomputed row sets bitwise equal to the timed call's rows"


def integrity_ok(c: dict, control: dict, root_profile: dict | None = None,
                 trusted_profile: dict | None = None) -> tuple[bool, str]:
    """Evidence that the candidate's work ran inside its timed window and did not slow its neighbours.
    `root_profile`: the root's profiled call of this run (the child profiles it in one cell only: it shows the
    profiler works here); the cell's own when it has one. `trusted_profile`: the root's profiled call in the control
    run (the GPU's: the root alone, in a trusted child), which then says whether the profiler works here: the run
    beside the candidate shares the candidate's process, which could break the profiler there (for the root's call
    or its own) and have every profiler check skipped."""
    s = c["samples"]
    prof = c["profile"]
    cp, rp = prof.get("candidate", {}), prof.get("root") or root_profile or {}
    if trusted_profile and "error" not in trusted_profile and trusted_profile.get("kernels"):
        if "error" in cp:
            return False, (f"the profiler failed on the candidate's call ({cp['error']}), and works for the root "
                           "timed alone")
        rp = trusted_profile
    notes = []
    if "error" in rp or not rp.get("kernels") or "error" in cp:
        notes.append("profiler unusable: " + str(rp.get("error") or cp.get("error") or "no kernels seen for the root"))
    else:
        if not cp.get("kernels"):
            return False, "no GPU kernel ran during a profiled call (nothing computed on the device?)"
        if cp.get("escaped"):
            return False, (f"{cp['escaped']} of the {cp['kernels']} kernels of a profiled call ended after the timed "
                           "stream had passed its end event: work on another stream escapes the timing events")
        if cp.get("overlap_spin"):
            return False, (f"{cp['overlap_spin']} kernels ran concurrently with the harness's spin kernel: "
                           "work on another stream escapes the timing events")
        if cp["kernel_us"] > 1.10 * cp["window_us"] + 2.0:
            return False, (f"{cp['kernel_us']:.1f} us of kernels in a {cp['window_us']:.1f} us event window: "
                           "work on another stream escapes the timing events")
    med_c = statistics.median(s["candidate"]["event_us"])
    eager = c.get("eager_us", {}).get("candidate")
    if c.get("timing") == "graph" and eager and statistics.median(eager) < 0.5 * med_c - 2.0:
        return False, (f"its eager call took {statistics.median(eager):.1f} us between the timing events, the CUDA "
                       f"graph of the same call {med_c:.1f} us: work escapes the timing events when not captured")
    if not notes and cp.get("kernels") and med_c < 0.7 * cp["kernel_us"] - 2.0:
        return False, (f"timed median {med_c:.1f} us is below the {cp['kernel_us']:.1f} us its own kernels took "
                       "under the profiler: the timings were tampered with")
    gap_c = statistics.median([w - e for w, e in zip(s["candidate"]["wall_us"], s["candidate"]["event_us"],
                                                      strict=True)])
    gap_r = statistics.median([w - e for w, e in zip(s["root"]["wall_us"], s["root"]["event_us"], strict=True)])
    med_r = statistics.median(s["root"]["event_us"])
    if gap_c - gap_r > 200.0 + 2.0 * max(med_c, med_r):
        return False, (f"host wall time exceeds the event time by {gap_c:.0f} us (root: {gap_r:.0f} us): "
                       "work escapes the timing events")
    if "samples" in control:
        for name in ("root", "incumbent"):
            if name in s and name in control["samples"]:
                beside, alone = med_of(s[name]), med_of(control["samples"][name])
                if beside > NEIGHBOUR_SLOWDOWN * alone + 2.0:
                    return False, (f"the {name} ran {beside / alone:.2f}x slower beside the candidate than alone "
                                   f"({beside:.1f} vs {alone:.1f} us)")
    if notes:
        return True, "skipped: " + notes[0]
    how = "graph replays" if c.get("timing") == "graph" else "eager calls"
    cover = "" if cp.get("spin_covered", True) else " (the profiled call outlasted its spin)"
    return True, f"timed {how}; kernels inside the timed window{cover}; neighbours not slowed"


def neighbours_slowed(doc: dict, control: dict) -> float | None:
    """The root's and incumbent's time beside the candidate over their time alone (the control run), geometric mean
    over every cell both timed; None where there is nothing to compare."""
    logs = []
    for name, c in doc.get("cells", {}).items():
        alone = control.get("cells", {}).get(name, {})
        if "error" in c or "error" in alone:
            continue
        for who in ("root", "incumbent"):
            b, a = c.get("samples", {}).get(who), alone.get("samples", {}).get(who)
            if b and a and b.get("event_us") and a.get("event_us"):
                beside, by_itself = med_of(b), med_of(a)
                if beside > 0 and by_itself > 0:
                    logs.append(math.log(beside / by_itself))
    return math.exp(sum(logs) / len(logs)) if logs else None


def med_of(samples: dict) -> float:
    return statistics.median(samples["event_us"])
