"""`evaluate()`: the trusted side of an evaluation.

1. The candidate's source is read and compiled (not executed) here: a missing file, a file that
   is not UTF-8 Python or a syntax error fails without starting anything.
2. The contract's probes (inputs only) go to a child that runs the candidate; the root runs in
   its own child on the same probes (cached per root source, contract, profile, seed, device).
3. Every check runs here, on the bytes that came back: the contract's, plus the generic ones —
   outputs have the root's dtypes and shapes; every probe's inputs are bitwise unchanged.
4. Only a verified candidate is timed: one child times candidate, root, incumbent and baseline
   interleaved; the timed outputs must match a reference computed here; on the GPU a control
   child times root and incumbent alone (a candidate that slows its neighbours is caught) and the
   profiler / wall-time evidence must show the candidate's work inside the timed window.

A bad candidate never raises: every failure is a one-line `failure` and failed checks.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from kernels.contract import CheckResult, Contract, Plan, ProbeResult, bitwise_equal, error_stats, evaluate_checks
from kernels.contracts import get_contract
from kernels.evaluator.protocol import ProtocolError, TensorWriter, encode, index_list, read_tensors, tensor_index
from kernels.evaluator.report import EvalReport, decide, environment, evaluator_fingerprint
from kernels.evaluator.sandbox import run_child
from kernels.evaluator.timing import summarize, variant_seeds

#: root results already computed in this process: (root sha, contract, profile, seed, device) -> results
_ROOT_CACHE: dict[tuple, dict[str, ProbeResult]] = {}
#: a candidate's timed output must be this close (relative RMS) to the reference, at least
MIN_TIMED_BOUND = 0.05
#: the root may run at most this much slower beside the candidate than alone (control run)
NEIGHBOUR_SLOWDOWN = 1.15
#: the control run (root and incumbent alone) is reused for this long within one process
CONTROL_TTL_S = 600.0
_CONTROL_CACHE: dict[tuple, tuple[float, dict]] = {}
#: interleaved rounds per cell (each round times every implementation once)
GPU_REPS = 30
CPU_REPS = 5


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:300] if msg else type(e).__name__


def evaluate(
    op: str | Contract,
    candidate_path: str | Path,
    *,
    root_path: str | Path | None = None,
    incumbent_path: str | Path | None = None,
    device: str | None = None,
    timeout: float = 60.0,
    time_it: bool | None = None,
    seed: int = 0,
    profile: str | None = None,
) -> EvalReport:
    """Check (and on a GPU time) one implementation file against its operator's contract.

    `op` is an operator name (raises `UnknownOperator` if unknown: a caller's error) or a
    `Contract`. `timeout` bounds each child's check phase; the timing child gets 3 × timeout.
    """
    t0 = time.monotonic()
    contract = op if isinstance(op, Contract) else get_contract(op)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    profile = profile or ("gpu" if cuda else "cpu")
    time_it = cuda if time_it is None else time_it
    report = EvalReport(op=contract.op, verified=False, failure=None, env=environment(device),
                        contract_fingerprint=contract.fingerprint(), evaluator_fingerprint=evaluator_fingerprint(),
                        profile=profile, seed=seed)
    try:
        _evaluate(report, contract, Path(candidate_path), root_path, incumbent_path, device, timeout, time_it)
    except Exception as e:  # an evaluator bug must still leave a report, and never pass
        report.failure = "evaluator error: " + one_line(e)
    decide(report)
    report.elapsed_s = time.monotonic() - t0
    return report


def source_problem(path: Path) -> tuple[str | None, str]:
    """(failure or None, sha256) of an implementation file, without executing it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return f"candidate file not found: {path}", ""
    except OSError as e:
        return f"cannot read {path}: {e.strerror}", ""
    sha = hashlib.sha256(raw).hexdigest()
    try:
        compile(raw.decode("utf-8"), str(path), "exec", dont_inherit=True)
    except UnicodeDecodeError:
        return "not a Python source file (not UTF-8 text)", sha
    except SyntaxError as e:
        return f"syntax error: {e.msg} (line {e.lineno})", sha
    except ValueError as e:  # NUL bytes
        return f"not a Python source file ({e})", sha
    return None, sha


#: an implementation has no business naming the evaluator or the modules it loads implementations as
_EVALUATOR_NAMES = re.compile(r"kernels\.evaluator|\bevaluator\.(timing|child|core|protocol|sandbox)\b|"
                              r"\btik_(root|incumbent|candidate|impl|contract)\b")


def source_policy(src: str) -> str | None:
    """A static screen (not a sandbox): sources that reach for the evaluator's own modules are rejected."""
    m = _EVALUATOR_NAMES.search(src)
    return f"the source references the evaluator ({m.group(0)!r})" if m else None


def _fail(report: EvalReport, name: str, requirement: str, reason: str) -> None:
    report.failure = reason[:300]
    report.checks.append(CheckResult(name, requirement, False, reason[:300]))


def _evaluate(report: EvalReport, contract: Contract, cand_path: Path, root_path, incumbent_path, device: str,
              timeout: float, time_it: bool) -> None:
    problem, report.source_sha256 = source_problem(cand_path)
    if problem:
        return _fail(report, "source", "runs", problem)
    problem = source_policy(cand_path.read_text(encoding="utf-8"))
    if problem:
        return _fail(report, "source_policy", "source_policy", problem)
    root_path = Path(root_path) if root_path is not None else contract.root_path
    root_problem, root_sha = source_problem(root_path)
    if root_problem:
        raise RuntimeError(f"root implementation: {root_problem}")
    plan = contract.plan(report.profile, report.seed)

    cand, failure = run_probes(plan, cand_path, device, timeout)
    if failure:
        return _fail(report, "run", "runs", failure)
    if not plan.needs_root:
        report.checks = evaluate_checks(plan, cand, None)
        if not all(c.passed for c in report.checks):
            # already failed: the root's child (only needed for output_spec here) is not worth its start
            report.checks.append(all_inputs_unchanged(plan, cand))
            return
    if root_sha == report.source_sha256:
        root = cand
    else:
        key = (root_sha, report.contract_fingerprint, report.profile, report.seed, device)
        root = _ROOT_CACHE.get(key)
        if root is None:
            root, failure = run_probes(plan, root_path, device, timeout)
            if failure:
                raise RuntimeError(f"the root implementation failed: {failure}")
            if len(_ROOT_CACHE) >= 8:
                _ROOT_CACHE.pop(next(iter(_ROOT_CACHE)))
            _ROOT_CACHE[key] = root
    report.checks = evaluate_checks(plan, cand, root if plan.needs_root else None)
    report.checks += [output_spec(plan, cand, root), all_inputs_unchanged(plan, cand)]
    graph = graph_replay_check(plan, cand, root)
    if graph is not None:
        report.checks.append(graph)
    if not time_it or not all(c.passed for c in report.checks):
        return
    _time(report, contract, cand_path, root_path, incumbent_path, device, timeout)


# ----------------------------------------------------------------------------- probes


def run_probes(plan: Plan, impl: Path, device: str, timeout: float) -> tuple[dict[str, ProbeResult] | None, str | None]:
    """Run every probe of `plan` on `impl` in a child. (results, None) or (None, one-line failure)."""

    def write_inputs(tmp: Path) -> dict:
        w = TensorWriter(tmp / "inputs.bin")
        probes = [{"id": p.id, "entry": p.entry, "args": encode(tuple(p.args), w), "kwargs": encode(dict(p.kwargs), w),
                   "grad_args": list(p.grad_args),
                   "grad_outputs": encode(tuple(p.grad_outputs), w) if p.grad_outputs is not None else None}
                  for p in plan.probes]
        return {"probes": probes, "tensors": w.close()}

    def read_result(out: Path, doc: dict) -> Any:
        if doc.get("import_error") is not None:
            return ("import", str(doc["import_error"])[:300])
        tensors = read_tensors(out / "outputs.bin", doc.get("tensors"))
        got = doc.get("probes")
        if not isinstance(got, dict) or set(got) != {p.id for p in plan.probes}:
            raise ProtocolError("probe results do not match the probes sent")
        results = {}
        for pid, r in got.items():
            if not isinstance(r, dict) or set(r) != {"error", "outputs", "inputs_after"}:
                raise ProtocolError(f"probe {pid}: malformed result")
            if r["error"] is not None:
                results[pid] = ProbeResult(error=str(r["error"])[:300])
                continue
            outs = [tensors[i] for i in index_list(r["outputs"], len(tensors), pid)]
            after = r["inputs_after"]
            after = [tensors[i] for i in index_list(after, len(tensors), pid)] if after is not None else None
            results[pid] = ProbeResult(outputs=outs, inputs_after=after)
        graphs = doc.get("graphs", {})
        if not isinstance(graphs, dict) or not set(graphs) <= {p.id for p in plan.probes}:
            raise ProtocolError("graph replay results do not match the probes sent")
        for pid, g in graphs.items():
            if not isinstance(g, dict) or set(g) != {"error", "replay", "eager"}:
                raise ProtocolError(f"graph replay {pid}: malformed result")
            results[GRAPH_PREFIX + pid] = ProbeResult(
                outputs=[tensors[i] for i in index_list(g["replay"], len(tensors), pid)],
                inputs_after=[tensors[i] for i in index_list(g["eager"], len(tensors), pid)],
                error=str(g["error"])[:300] if g["error"] is not None else None)
        return ("ok", results)

    job = {"mode": "probes", "impl": str(impl.resolve()), "device": device, "limits": _limits(timeout),
           "graph_probes": graph_probe_ids(plan) if device.startswith("cuda") else []}
    outcome = run_child(job, write_inputs, read_result, timeout)
    if outcome.failure:
        return None, outcome.failure
    kind, value = outcome.doc
    if kind == "import":
        return None, f"import failed: {value}"
    return value, None


def graph_probe_ids(plan: Plan) -> list[str]:
    """The probes replayed through a CUDA graph: the first forward probe of each entry that echoes its inputs."""
    seen, ids = set(), []
    for p in plan.probes:
        if p.echo_inputs and not p.grad_args and p.entry not in seen:
            seen.add(p.entry)
            ids.append(p.id)
    return ids


def _limits(timeout: float) -> dict:
    return {"cpu_s": int(timeout * 4) + 60, "address_space_bytes": 24 << 30}


#: graph replays come back as extra results keyed by this prefix + probe id (outputs = replayed,
#: inputs_after = the eager call on the changed inputs)
GRAPH_PREFIX = "graph:"


def graph_replay_check(plan: Plan, cand: dict[str, ProbeResult], root: dict[str, ProbeResult]) -> CheckResult | None:
    """On the GPU: a CUDA graph of the call, replayed after the inputs changed in place, gives the bits of a
    fresh call on the changed inputs. Not applicable (skipped) where the root itself cannot be captured."""
    ids = [k for k in cand if k.startswith(GRAPH_PREFIX)]
    if not ids:
        return None
    name, req = "cuda_graph_replay", "graph_replay"
    n, skipped = 0, []
    for k in ids:
        c, r = cand[k], root.get(k)
        if r is not None and r.error is not None:
            skipped.append(f"{k[len(GRAPH_PREFIX):]} (root not capturable: {r.error})")
            continue
        if c.error is not None:
            return CheckResult(name, req, False,
                               f"{k[len(GRAPH_PREFIX):]}: CUDA-graph capture/replay failed: {c.error}")
        if len(c.outputs) != len(c.inputs_after or []):
            return CheckResult(name, req, False, f"{k[len(GRAPH_PREFIX):]}: replay and eager output counts differ")
        for j, (a, b) in enumerate(zip(c.outputs, c.inputs_after, strict=True)):
            ok, detail, d = (False, f"output {j}: {_spec(a)} vs {_spec(b)}", None) if (
                a.dtype != b.dtype or a.shape != b.shape) else bitwise_equal(a, b, f"output {j}")
            if not ok:
                return CheckResult(name, req, False, f"{k[len(GRAPH_PREFIX):]}: replay after changing the inputs "
                                   f"differs from a fresh call: {detail}", d)
        n += 1
    note = f"; skipped {', '.join(skipped)}" if skipped else ""
    return CheckResult(name, req, True, f"{n} graph replays bitwise equal to fresh calls{note}"[:300])


def output_spec(plan: Plan, cand: dict[str, ProbeResult], root: dict[str, ProbeResult]) -> CheckResult:
    """Every probe's outputs have the root's count, dtypes and shapes."""
    n = 0
    for p in plan.probes:
        c, r = cand.get(p.id), root.get(p.id)
        if c is None or r is None or c.error or r.error:
            continue
        if len(c.outputs) != len(r.outputs):
            return CheckResult("output_spec", "output_spec", False,
                               f"{p.id}: {len(c.outputs)} outputs, the root returns {len(r.outputs)}")
        for k, (x, y) in enumerate(zip(c.outputs, r.outputs, strict=True)):
            if x.dtype != y.dtype or x.shape != y.shape:
                return CheckResult("output_spec", "output_spec", False,
                                   f"{p.id}: output {k} is {_spec(x)}, the root's is {_spec(y)}")
        n += 1
    return CheckResult("output_spec", "output_spec", True, f"{n} probes: outputs have the root's dtypes and shapes")


def _spec(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def all_inputs_unchanged(plan: Plan, cand: dict[str, ProbeResult]) -> CheckResult:
    """Every probe (not only the contract's chosen one) leaves its tensor arguments bitwise unchanged."""
    n = 0
    for p in plan.probes:
        r = cand.get(p.id)
        if r is None or r.error or r.inputs_after is None:
            continue
        sent = [a for a in p.args if isinstance(a, torch.Tensor)]
        if len(sent) != len(r.inputs_after):
            return CheckResult("inputs_unchanged[all probes]", "inputs_unchanged", False,
                               f"{p.id}: {len(r.inputs_after)} inputs echoed, {len(sent)} sent")
        for k, (a, b) in enumerate(zip(r.inputs_after, sent, strict=True)):
            ok, detail, _ = (False, f"input {k}: {_spec(a)} vs {_spec(b)}", None) if (
                a.dtype != b.dtype or a.shape != b.shape) else bitwise_equal(a, b, f"input {k}")
            if not ok:
                return CheckResult("inputs_unchanged[all probes]", "inputs_unchanged", False,
                                   f"{p.id}: input mutated: {detail}")
        n += 1
    return CheckResult("inputs_unchanged[all probes]", "inputs_unchanged", True,
                       f"{n} probes left their inputs bitwise unchanged")


# ----------------------------------------------------------------------------- timing


def _contract_file(contract: Contract) -> str:
    return str(Path(inspect.getfile(contract.build_plan)).resolve())


def run_timing(contract: Contract, impls: list[tuple[str, Path]], *, device: str, profile: str, seed: int,
               timeout: float, return_outputs: tuple[str, ...] = (), profile_kernels: bool = False,
               reps: int | None = None) -> tuple[dict | None, str | None]:
    cuda = device.startswith("cuda")
    cells = [c.name for c in contract.cells(profile)]
    job = {"mode": "time", "op": contract.op, "contract_file": _contract_file(contract), "profile": profile,
           "seed": seed, "device": device, "impls": [[n, str(p.resolve())] for n, p in impls], "cells": cells,
           "reps": reps or (GPU_REPS if cuda else CPU_REPS), "warmup": 3 if cuda else 1, "variants": 2,
           "return_outputs": list(return_outputs), "profile_kernels": profile_kernels, "limits": _limits(timeout)}

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
            if c.get("seeds") != variant_seeds(seed, job["variants"]):
                raise ProtocolError(f"cell {name}: wrong input seeds")
            parsed[name] = {
                "samples": {str(k): {"event_us": _floats(v["event_us"]), "wall_us": _floats(v["wall_us"])}
                            for k, v in _dict(c["samples"]).items()},
                "errors": {str(k): str(v)[:300] for k, v in _dict(c["errors"]).items()},
                "profile": {str(k): _dict(v) for k, v in _dict(c["profile"]).items()},
                "outputs": {str(k): [[_sent(o, tensors, name) for o in per_v] for per_v in _list(v)]
                            for k, v in _dict(c["outputs"]).items()},
                "seeds": c["seeds"],
            }
        floor = doc.get("floor_us")
        return {"cells": parsed, "floor_us": float(floor) if isinstance(floor, (int, float)) else None,
                "import_errors": {str(k): str(v)[:300] for k, v in _dict(doc.get("import_errors", {})).items()}}

    outcome = run_child(job, lambda tmp: {}, read_result, 3 * timeout + 10 * len(cells) * (1 if cuda else 0))
    return outcome.doc, outcome.failure


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


def _floats(x: Any) -> list[float]:
    if not isinstance(x, list) or len(x) > 100_000:
        raise ProtocolError("expected a list of samples")
    out = []
    for v in x:
        if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
            raise ProtocolError("a timing sample is not a finite non-negative number")
        out.append(float(v))
    return out


def _time(report: EvalReport, contract: Contract, cand_path: Path, root_path: Path, incumbent_path,
          device: str, timeout: float) -> None:
    cuda = device.startswith("cuda")
    report.timing = "gpu" if cuda else "interpreter"
    trusted = [("root", root_path)] + ([("incumbent", Path(incumbent_path))] if incumbent_path else [])
    doc, failure = run_timing(contract, trusted + [("candidate", cand_path)], device=device, profile=report.profile,
                              seed=report.seed, timeout=timeout, return_outputs=("candidate", "root"),
                              profile_kernels=cuda)
    if failure:
        return _fail(report, "timing/run", "timed_outputs", f"timing run: {failure}")
    errs = doc["import_errors"]
    if "candidate" in errs:
        return _fail(report, "timing/run", "timed_outputs", f"timing run: {errs['candidate']}")
    if errs:
        raise RuntimeError(f"timing run: {'; '.join(f'{k} {v}' for k, v in errs.items())}")
    control = None
    if cuda:
        key = (tuple((n, hashlib.sha256(p.read_bytes()).hexdigest()) for n, p in trusted), report.contract_fingerprint,
               tuple(c.name for c in contract.cells(report.profile)), report.profile, report.seed, device, GPU_REPS)
        hit = _CONTROL_CACHE.get(key)
        if hit is not None and time.monotonic() - hit[0] < CONTROL_TTL_S:
            control = hit[1]
        else:
            control, failure = run_timing(contract, trusted, device=device, profile=report.profile, seed=report.seed,
                                          timeout=timeout)
            if failure:
                raise RuntimeError(f"control timing run: {failure}")
            _CONTROL_CACHE.clear()
            _CONTROL_CACHE[key] = (time.monotonic(), control)
    report.floor_us = doc["floor_us"]
    outputs_check, integrity = _TimedChecks("timing/outputs", "timed_outputs"), _TimedChecks(
        "timing/integrity", "timing_integrity")
    bound = max([MIN_TIMED_BOUND] + [4 * t.rel_rms for t in contract.tolerances.values()])
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
        outputs_check.add(cell.name, timed_outputs_ok(contract, cell, c, device, bound))
        if cuda:
            integrity.add(cell.name, integrity_ok(c, control["cells"][cell.name]))
        report.cells.append(_cell_row(cell, c, control["cells"][cell.name] if control else None))
    report.checks.append(outputs_check.result())
    if cuda:
        report.checks.append(integrity.result())


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
    base = summarize(s["baseline"]["event_us"]) if "baseline" in s else summarize([])
    wall = summarize(s.get("candidate", {}).get("wall_us", []))
    med = cand["median_us"]
    row = {
        "cell": cell.name, "coeff": cell.coeff, "limit": cell.limit,
        "median_us": med, "spread_us": cand["spread_us"], "samples": cand["samples"],
        "root_median_us": root["median_us"], "incumbent_median_us": inc["median_us"],
        "baseline_median_us": base["median_us"],
        "ratio_vs_root": med / root["median_us"] if med is not None and root["median_us"] else None,
        "ratio_vs_baseline": med / base["median_us"] if med is not None and base["median_us"] else None,
        "root_spread_us": root["spread_us"], "wall_median_us": wall["median_us"],
    }
    if control is not None and "samples" in control and "root" in control["samples"]:
        row["root_alone_median_us"] = summarize(control["samples"]["root"]["event_us"])["median_us"]
    return row


def close_to(outs: list, refs: list[torch.Tensor], bound: float) -> tuple[bool, str]:
    """Timed outputs (tensors, or (data, rows) pairs) against reference tensors, loosely (see MIN_TIMED_BOUND)."""
    if len(outs) != len(refs):
        return False, f"{len(outs)} outputs, reference has {len(refs)}"
    worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if isinstance(o, tuple):
            o, rows = o
            if rows is not None:
                if r.dim() == 0 or int(rows.max(initial=-1)) >= r.shape[0] or int(rows.min(initial=0)) < 0:
                    return False, f"output {k}: row sample outside the output"
                r = r[rows]
        if o.shape != r.shape or o.dtype != r.dtype:
            return False, f"output {k} is {_spec(o)}, reference {_spec(r)}"
        if o.is_floating_point():
            _, rel = error_stats(o, r)
            if not rel <= bound:
                return False, f"output {k}: rel_rms {rel:.3g} from the reference (bound {bound:g})"
            worst = max(worst, rel)
        else:
            frac = float((o == r).double().mean()) if o.numel() else 1.0
            if frac < 0.99:
                return False, f"output {k}: only {frac:.1%} of elements equal to the reference"
    return True, f"rel_rms <= {worst:.3g}"


def timed_outputs_ok(contract: Contract, cell, c: dict, device: str, bound: float) -> tuple[bool, str]:
    """The outputs of the candidate's timed calls, per input variant, against a reference computed here:
    the stock-PyTorch baseline when the root's timed outputs agree with it, else the root's timed outputs."""
    cand = c["outputs"].get("candidate", [])
    root = c["outputs"].get("root", [])
    seeds = c["seeds"]
    if len(cand) != len(seeds):
        return False, f"{len(cand)} timed outputs for {len(seeds)} input variants"
    for v, s in enumerate(seeds):
        case = contract.bench_case(cell, s, device)
        refs, what = None, "root's timed output"
        if case.baseline is not None:
            from kernels.contract import flatten_outputs

            base = [t.detach().to("cpu") for t in flatten_outputs(case.baseline())]
            if v < len(root) and close_to(root[v], base, bound)[0]:
                refs, what = base, "stock-PyTorch output"
        del case
        outs = cand[v]
        if refs is None:
            if v >= len(root) or len(root[v]) != len(outs):
                return False, "no reference for the timed outputs"
            # the root's outputs went through the same row sample: compare the sampled data directly
            if any((a[1] is None) != (b[1] is None) or (a[1] is not None and not torch.equal(a[1], b[1]))
                   for a, b in zip(outs, root[v], strict=True)):
                return False, "timed outputs sampled differently from the root's"
            refs, outs = [d for d, _ in root[v]], [d for d, _ in outs]
        ok, detail = close_to(outs, refs, bound)
        if not ok:
            return False, f"timed call on input variant {v} is wrong vs the {what}: {detail}"
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return True, f"timed outputs match the reference on {len(seeds)} input variants"


def integrity_ok(c: dict, control: dict) -> tuple[bool, str]:
    """Evidence that the candidate's work ran inside its timed window and did not slow its neighbours."""
    s = c["samples"]
    prof = c["profile"]
    cp, rp = prof.get("candidate", {}), prof.get("root", {})
    notes = []
    if "error" in rp or not rp.get("kernels") or "error" in cp:
        notes.append("profiler unusable: " + str(rp.get("error") or cp.get("error") or "no kernels seen for the root"))
    else:
        if not cp.get("kernels"):
            return False, "no GPU kernel ran during a profiled call (nothing computed on the device?)"
        if cp.get("overlap_spin"):
            return False, (f"{cp['overlap_spin']} kernels ran concurrently with the harness's spin kernel: "
                           "work on another stream escapes the timing events")
        if cp["kernel_us"] > 1.10 * cp["window_us"] + 2.0:
            return False, (f"{cp['kernel_us']:.1f} us of kernels in a {cp['window_us']:.1f} us event window: "
                           "work on another stream escapes the timing events")
    med_c = statistics.median(s["candidate"]["event_us"])
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
    return True, "skipped: " + notes[0] if notes else "kernels inside the timed window; neighbours not slowed"


def med_of(samples: dict) -> float:
    return statistics.median(samples["event_us"])
