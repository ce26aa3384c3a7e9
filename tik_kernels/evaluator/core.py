"""`evaluate()`: the trusted side of an evaluation.

1. The candidate's source is read and compiled (not executed) here: a missing file, a file that
   is not UTF-8 Python or a syntax error fails without starting anything.
2. The contract's probes (inputs only) go to a child that runs the candidate; the root runs in
   its own child on the same probes (cached per root source, contract, profile, seed, device): on the
   GPU before the candidate (its kernels seed the candidate's Triton cache), on the CPU beside it
   (`_root_ahead`), and there once per search between the processes of a local pool (`ROOT_SHARE`).
3. Every check runs here, on the bytes that came back: the contract's, plus the generic ones —
   outputs have the root's dtypes and shapes; every probe's inputs are bitwise unchanged; on the
   GPU a CUDA graph replayed on changed inputs matches a fresh call (`checks.py`).
4. Only a verified candidate's timing counts, and it is timed by the child that ran its probes
   (`spawn.PhasedChild`), which times candidate, root and incumbent (and on the CPU stock PyTorch)
   interleaved, with the candidate module and kernels its probes loaded; one start per candidate, not two.
   On the CPU it waits while the checks run here and is told to time only when they all passed (else to
   stop, and killed); on the GPU it is told at once and timed while the checks run here (`OVERLAP_CHECKS`:
   the device does not idle for them), and a failed check kills it and is the report's failure. The root evaluated as
   its own candidate, which writes the trusted Triton cache, is timed by a timing child of its own
   (`sandbox.candidate_cache`). The timed outputs must match a reference computed here; on the GPU
   a control child times root, incumbent and stock PyTorch alone (a candidate that slows its
   neighbours is caught; the ratio to stock is chained through the root) and the profiler /
   wall-time evidence must show the candidate's work inside the timed window (`measure.py` here,
   `timing.py` in the child).

A bad candidate never raises: every failure is a one-line `failure` and failed checks.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tik_kernels.contract import Contract, Plan, ProbeResult, evaluate_checks
from tik_kernels.contracts import get_contract
from tik_kernels.evaluator import ahead as _AHEAD
from tik_kernels.evaluator import devlock, integrity
from tik_kernels.evaluator.checks import GRAPH_PREFIX, all_inputs_unchanged, graph_replay_check, output_spec
from tik_kernels.evaluator.measure import candidate_timing_job, time_candidate
from tik_kernels.evaluator.protocol import (
    ProtocolError,
    TensorWriter,
    encode,
    index_list,
    listen_shared,
    read_tensors,
    receive_shared,
    tensor_index,
    tensors_from,
)
from tik_kernels.evaluator.report import EvalReport, decide, environment, evaluator_fingerprint, fail
from tik_kernels.evaluator.sandbox import candidate_cache, isolation, limits, owned_tempdir, policy
from tik_kernels.evaluator.spares import prepare, quiet_spares, settle_spares
from tik_kernels.evaluator.spawn import ChildOutcome, PhasedChild, run_child

#: the candidate's timing starts as soon as its probes are back, while the parent checks them; a check that fails
#: stops it (`PhasedChild.then`'s abort), and the report is the check's failure, as without. None: on the GPU only,
#: where the checks (CPU work: linear's 0.8 s on the H200) then no longer hold the device idle; the CPU's timings are
#: interpreter times on two cores, which the parent's checks beside them would only make noisier. Only once the
#: root's probes are kept in this process: the checks never start a root child while a candidate is being timed
OVERLAP_CHECKS: bool | None = None
#: root results already computed in this process: (root sha, contract, profile, seed, device) -> results
_ROOT_CACHE: dict[tuple, dict[str, ProbeResult]] = {}
#: plans already built in this process (linear's GPU plan takes ~25 s of CPU to build: GBs of inputs)
_PLAN_CACHE: dict[tuple, tuple[Contract, Plan]] = {}
_PLANS_KEPT = 2


def plan_for(contract: Contract, profile: str, seed: int) -> Plan:
    """`contract.plan(profile, seed)`, built once per process. A plan is deterministic in its contract
    (source fingerprint), profile and seed, and nothing writes to its tensors: the child gets copies,
    and the checks only read."""
    key = (id(contract), contract.fingerprint(), profile, seed)
    hit = _PLAN_CACHE.pop(key, None)
    if hit is None:
        hit = (contract, contract.plan(profile, seed))  # the contract is kept so its id stays its own
        while len(_PLAN_CACHE) >= _PLANS_KEPT:
            _drop_inputs(_PLAN_CACHE.pop(next(iter(_PLAN_CACHE)))[1])
    _PLAN_CACHE[key] = hit
    return hit[1]


@dataclass
class _Inputs:
    """A kept plan's probes as a child gets them (`probes_job`): the file of their tensors, written once per process,
    the JSON that names them, and the tensors by index."""

    path: Path
    probes: list
    entries: list
    sent: list


#: the inputs file of each plan `plan_for` keeps, by id(plan) (dropped with the plan), and where they live
_INPUTS: dict[int, _Inputs] = {}
_INPUTS_LOCK = threading.Lock()
_INPUTS_DIR: Path | None = None


def _drop_inputs(plan: Plan) -> None:
    with _INPUTS_LOCK:
        kept = _INPUTS.pop(id(plan), None)
    if kept is not None:
        kept.path.unlink(missing_ok=True)


def _kept(plan: Plan) -> bool:
    return any(p is plan for _, p in _PLAN_CACHE.values())


def _write_probes(plan: Plan, path: Path) -> tuple[list, list, list]:
    """(probes JSON, tensor manifest, tensors by index) of `plan`, its tensors written to `path`."""
    w = TensorWriter(path)
    probes = [{"id": p.id, "entry": p.entry, "args": encode(tuple(p.args), w), "kwargs": encode(dict(p.kwargs), w),
               "grad_args": list(p.grad_args),
               "grad_outputs": encode(tuple(p.grad_outputs), w) if p.grad_outputs is not None else None}
              for p in plan.probes]
    return probes, w.close(), w.tensors


def _link_inputs(plan: Plan, dest: Path) -> _Inputs:
    """`plan`'s inputs file (written now if this process has none yet) as `dest`: a hard link where the child runs
    jailed, which mounts `dest`'s directory read-only (a link is one file: a child that could write it would
    change every later child's inputs); a copy otherwise (an unconfined child, `sandbox=False`, could write through
    a link). Either way no check reads the file: they compare against the plan's own tensors."""
    global _INPUTS_DIR
    with _INPUTS_LOCK:
        kept = _INPUTS.get(id(plan))
        if kept is None:
            if _INPUTS_DIR is None:
                _INPUTS_DIR = owned_tempdir("tik-inputs-")
                atexit.register(shutil.rmtree, _INPUTS_DIR, True)
            part = _INPUTS_DIR / f"{id(plan)}.part"
            kept = _Inputs(_INPUTS_DIR / f"{id(plan)}.bin", *_write_probes(plan, part))
            os.replace(part, kept.path)
            _INPUTS[id(plan)] = kept
    if isolation(trusted=False)[0] is None:
        shutil.copyfile(kept.path, dest)
    else:
        try:
            os.link(kept.path, dest)
        except OSError:  # another file system
            shutil.copyfile(kept.path, dest)
    return kept


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
    sandbox: bool | None = None,
) -> EvalReport:
    """Check (and on a GPU time) one implementation file against its operator's contract.

    `op` is an operator name (raises `UnknownOperator` if unknown: a caller's error) or a
    `Contract`. `timeout` bounds each child's check phase; the timing child gets 3 × timeout.
    `sandbox=False` runs the children without the jail (`sandbox.py`); None: unless $TIK_UNSAFE_NO_SANDBOX.
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
        # another TIK process's timing on this GPU waits for this evaluation, and this one's timing for theirs
        with policy(sandbox), candidate_cache(), devlock.shared(device):
            _evaluate(report, contract, Path(candidate_path), root_path, incumbent_path, device, timeout, time_it)
    except Exception as e:  # an evaluator bug must still leave a report, and never pass
        report.failure = "evaluator error: " + one_line(e)
    # a trusted file changed during the evaluation: what the children ran may not be what was checked
    changed = integrity.changed()
    if changed and not report.failure:
        fail(report, "integrity", "runs", changed)
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
    return _compile_problem(raw), sha


@functools.lru_cache(maxsize=64)
def _compile_problem(raw: bytes) -> str | None:
    """Why these bytes are not a Python source (None: they compile), once per content: an evaluation asks about its
    root and the library's root again and again (~3 ms each for linear)."""
    try:
        compile(raw.decode("utf-8"), "<implementation>", "exec", dont_inherit=True)
    except UnicodeDecodeError:
        return "not a Python source file (not UTF-8 text)"
    except SyntaxError as e:
        return f"syntax error: {e.msg} (line {e.lineno})"
    except ValueError as e:  # NUL bytes
        return f"not a Python source file ({e})"
    return None


#: an implementation has no business naming the evaluator or the modules it loads implementations as
_EVALUATOR_NAMES = re.compile(r"(tik_)?kernels\.evaluator|\bevaluator\.(timing|child|core|protocol|sandbox|spawn"
                              r"|spares|servers|checks|measure|report)\b"
                              r"|\btik_(root|incumbent|candidate|impl|contract|store|tui)\b")


def source_policy(src: str) -> str | None:
    """A static screen: sources that name the evaluator's own modules are rejected before anything runs, with a
    clear reason. An obfuscated name passes it; what stops that import is the child's runtime guard
    (`child.guard_imports`), and what the parent decides never rests on either (see there)."""
    m = _EVALUATOR_NAMES.search(src)
    return f"the source references the evaluator ({m.group(0)!r})" if m else None


def library_root(contract: Contract, sha: str) -> bool:
    """Whether a file with this sha256 is the library's own root implementation of `contract`."""
    try:
        return source_problem(contract.root_path)[1] == sha
    except FileNotFoundError:  # a contract whose root is not importable here (a test's)
        return False


def _evaluate(report: EvalReport, contract: Contract, cand_path: Path, root_path, incumbent_path, device: str,
              timeout: float, time_it: bool) -> None:
    problem = integrity.changed()
    if problem:
        return fail(report, "integrity", "runs", problem)
    problem, report.source_sha256 = source_problem(cand_path)
    if problem:
        return fail(report, "source", "runs", problem)
    refused = isolation(trusted=library_root(contract, report.source_sha256))[1]
    if refused:
        return fail(report, "sandbox", "runs", refused)
    problem = source_policy(cand_path.read_text(encoding="utf-8"))
    if problem:
        return fail(report, "source_policy", "source_policy", problem)
    root_path = Path(root_path) if root_path is not None else contract.root_path
    root_problem, root_sha = source_problem(root_path)
    if root_problem:
        raise RuntimeError(f"root implementation: {root_problem}")
    t = time.monotonic()
    plan = plan_for(contract, report.profile, report.seed)
    report.phases["plan"] = time.monotonic() - t

    key = _root_key(root_sha, contract, report.profile, report.seed, device)
    is_root = root_sha == report.source_sha256
    if device.startswith("cuda") and plan.needs_root and not is_root and key not in _ROOT_CACHE:
        # the root first: its kernels then seed the candidate's cache (none are compiled twice)
        _root_probes(report, plan, root_path, device, timeout, key, library_root(contract, root_sha))
    elif not device.startswith("cuda") and not is_root and key not in _ROOT_CACHE:
        _root_ahead(report, plan, root_path, device, timeout, key, library_root(contract, root_sha))
    try:
        _candidate(report, contract, plan, cand_path, root_path, incumbent_path, device, timeout, time_it, key,
                   root_sha, is_root)
    finally:
        _root_joined(key, quiet=True)  # a candidate that failed before its checks: the root's thread is done too


def _candidate(report: EvalReport, contract: Contract, plan: Plan, cand_path: Path, root_path: Path, incumbent_path,
               device: str, timeout: float, time_it: bool, key: tuple, root_sha: str, is_root: bool) -> None:
    """The candidate's probes, checks and (`time_it`) timing, into the report."""
    if time_it and not is_root:
        # one child for the candidate: its probes, then (once every check here has passed) its timing
        timing = candidate_timing_job(contract, cand_path, root_path, incumbent_path, device, report.profile,
                                      report.seed, timeout)
        # its rlimits (set once, at its start) cover both phases; each phase has its own wall-clock kill
        job, write_inputs, read_result = probes_job(plan, cand_path, device, timeout + timing[1])
        with PhasedChild(job, write_inputs, timing[0], cache="candidate" if device.startswith("cuda") else "private") \
                as child:
            t = time.monotonic()
            cand, failure = probe_outcome(child.first(read_result, timeout), report.phases, "probes_candidate")
            report.phases["probes_candidate"] = time.monotonic() - t
            if failure:
                return fail(report, "run", "runs", failure)
            overlap = OVERLAP_CHECKS if OVERLAP_CHECKS is not None else device.startswith("cuda")
            if overlap and key in _ROOT_CACHE:
                _check_while_timed(report, contract, plan, cand, cand_path, root_path, incumbent_path, device,
                                   timeout, key, root_sha, child, timing)
            elif _check(report, contract, plan, cand, root_path, device, timeout, key, root_sha, is_root):
                # the next candidate's child (`spares.Spares`) has been starting since this one's probes began: the
                # GPU is timed with it paused, not while a CUDA context is being created beside it
                with _quiet(device, report):
                    time_candidate(report, contract, cand_path, root_path, incumbent_path, device, timeout,
                                   phased=child)
            else:
                child.stop()
            t = time.monotonic()
        # the child killed (if still there) and its directories removed (diagnostics)
        report.phases["child_close"] = time.monotonic() - t
        return
    t = time.monotonic()
    cand, failure = run_probes(plan, cand_path, device, timeout, trusted=is_root,
                               library=library_root(contract, report.source_sha256), phases=report.phases)
    report.phases["probes_candidate"] = time.monotonic() - t
    if failure:
        return fail(report, "run", "runs", failure)
    if _check(report, contract, plan, cand, root_path, device, timeout, key, root_sha, is_root) and time_it:
        # the root as its own candidate (trusted: its probe child wrote the trusted cache): a timing child of its own
        with _quiet(device, report):
            time_candidate(report, contract, cand_path, root_path, incumbent_path, device, timeout)


def _check_while_timed(report: EvalReport, contract: Contract, plan: Plan, cand: dict[str, ProbeResult],
                       cand_path: Path, root_path: Path, incumbent_path, device: str, timeout: float, key: tuple,
                       root_sha: str, child: PhasedChild, timing: tuple) -> None:
    """`OVERLAP_CHECKS`: the candidate's child told to time (in a thread, which alone handles the child from then
    on) while this thread checks its probes; a failed check stops the timing and is the report's failure. `timing`:
    the child's timing job (`candidate_timing_job`: job, wall-clock limit, reader of the reply)."""
    with _quiet(device, report):  # as in `_candidate`: no CUDA context created beside the timing
        _, wall, read_result = timing
        abort, got = threading.Event(), {}
        timing = threading.Thread(target=lambda: got.update(outcome=child.then(read_result, wall, abort)),
                                  name="tik-timing", daemon=True)
        timing.start()
        try:
            passed = _check(report, contract, plan, cand, root_path, device, timeout, key, root_sha, False)
        except BaseException:
            abort.set()
            timing.join()
            raise
        if not passed:
            abort.set()
        timing.join()
        report.phases["checks_overlapped"] = 1.0
        if passed:
            time_candidate(report, contract, cand_path, root_path, incumbent_path, device, timeout,
                           phased=child, outcome=got["outcome"])


@contextlib.contextmanager
def _quiet(device: str, report: EvalReport):
    """A GPU timed alone: this process's spares still starting paused (`spares.quiet_spares`), then the device's lock
    held exclusive (`devlock`: no other TIK process's GPU work beside it). Its phases: `spare_settle`, `device_wait`
    (and `device_wait_gave_up`, 1, where the lock was not had in time). Elsewhere a block that does nothing (the CPU
    times the interpreter)."""
    if not device.startswith("cuda"):
        yield
        return
    with quiet_spares(device) as q:
        report.phases["spare_settle"] = q["s"]
        with devlock.exclusive(device) as lock:
            report.phases["device_wait"] = lock["wait_s"]
            if lock["gave_up"]:
                report.phases["device_wait_gave_up"] = 1.0
            yield


def _check(report: EvalReport, contract: Contract, plan: Plan, cand: dict[str, ProbeResult], root_path: Path,
           device: str, timeout: float, key: tuple, root_sha: str, is_root: bool) -> bool:
    """Every check on the candidate's probe results, into the report: whether all passed."""
    if not plan.needs_root:
        report.checks = evaluate_checks(plan, cand, None)
        if not all(c.passed for c in report.checks):
            # already failed: the root's child (only needed for output_spec here) is not worth its start
            report.checks.append(all_inputs_unchanged(plan, cand))
            return False
    root = cand if is_root else (_ROOT_CACHE.get(key) or _root_joined(key)
                                 or _root_probes(report, plan, root_path, device, timeout, key,
                                                 library_root(contract, root_sha)))
    t = time.monotonic()
    report.checks = evaluate_checks(plan, cand, root if plan.needs_root else None)
    report.checks += [output_spec(plan, cand, root), all_inputs_unchanged(plan, cand)]
    graph = graph_replay_check(plan, cand, root)
    if graph is not None:
        report.checks.append(graph)
    report.phases["checks"] = time.monotonic() - t
    return all(c.passed for c in report.checks)


# ----------------------------------------------------------------------------- probes


def _root_key(root_sha: str, contract: Contract, profile: str, seed: int, device: str) -> tuple:
    return (root_sha, contract.fingerprint(), profile, seed, device)


def warm_root(op: str | Contract, *, device: str, timeout: float = 60.0, seed: int = 0,
              profile: str | None = None, root_path: str | Path | None = None) -> float:
    """Run the root's probes now, in their trusted child, and keep them for this process (a later `evaluate`
    of the same root source, contract, profile, seed and device reuses them); the seconds it took (0 when
    they were already kept). `root_path` defaults to the contract's (the library's) root."""
    contract = op if isinstance(op, Contract) else get_contract(op)
    profile = profile or ("gpu" if device.startswith("cuda") else "cpu")
    root_path = Path(root_path) if root_path is not None else contract.root_path
    problem, root_sha = source_problem(root_path)
    if problem:
        raise RuntimeError(f"root implementation: {problem}")
    key = _root_key(root_sha, contract, profile, seed, device)
    if key in _ROOT_CACHE:
        return 0.0
    report = EvalReport(op=contract.op, verified=False, failure=None)
    _root_probes(report, plan_for(contract, profile, seed), root_path, device, timeout, key,
                 library_root(contract, root_sha))
    return report.phases["probes_root"]


def _root_probes(report: EvalReport, plan: Plan, root_path: Path, device: str, timeout: float,
                 key: tuple, library: bool) -> dict[str, ProbeResult]:
    """The root's probe results, computed in a trusted child (or by another process of this search: `ROOT_SHARE`)
    and kept for this process."""
    t = time.monotonic()

    def compute() -> dict[str, ProbeResult]:
        root, failure = run_probes(plan, root_path, device, timeout, trusted=True, library=library,
                                   phases=report.phases, prefix="probes_root")
        if failure:
            raise RuntimeError(f"the root implementation failed: {failure}")
        return root

    if ROOT_SHARE is not None and device == "cpu":
        root, shared = _shared_root(ROOT_SHARE, key, plan, compute)
        if shared:
            report.phases["probes_root_shared"] = 1.0
    else:
        root = compute()
    report.phases["probes_root"] = time.monotonic() - t
    if len(_ROOT_CACHE) >= 8:
        _ROOT_CACHE.pop(next(iter(_ROOT_CACHE)))
    _ROOT_CACHE[key] = root
    return root


#: the root's probes running beside a CPU candidate's (`_root_ahead`), by root key: (thread, what it raised)
_ROOT_THREADS: dict[tuple, tuple[threading.Thread, list]] = {}


def _root_ahead(report: EvalReport, plan: Plan, root_path: Path, device: str, timeout: float, key: tuple,
                library: bool) -> None:
    """On the CPU, the root's probes (not kept yet) start now, in their trusted child, beside the candidate's instead
    of after them: the evaluator idles while a child computes, and a search with one evaluator has a core to spare
    (attention's root probes: ~3.5 s of a first evaluation). They wait first until the fork server and the candidate's
    spare have started (`Spares.settle`), so the root's child is forked too, not a fresh interpreter beside them.
    `_root_joined` waits for them."""
    if key in _ROOT_THREADS:
        return
    raised: list = []

    def run() -> None:
        try:
            prepare(device)  # the fork server, unless it is up or starting
            settle_spares(device)
            _root_probes(report, plan, root_path, device, timeout, key, library)
        except Exception as e:  # handed to the thread that needs the root (`_root_joined`)
            raised.append(e)

    # in this thread's context: the evaluation's sandbox policy (`sandbox.policy`) holds for the root's child too
    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="tik-root-ahead", daemon=True)
    _ROOT_THREADS[key] = (thread, raised)
    thread.start()


def _root_joined(key: tuple, quiet: bool = False) -> dict[str, ProbeResult] | None:
    """The root's results from its thread (`_root_ahead`) once it is done, None when none ran; what the thread
    raised is raised here, unless `quiet` (the evaluation no longer needs them; the next one computes them again)."""
    thread, raised = _ROOT_THREADS.pop(key, (None, []))
    if thread is None:
        return None
    thread.join()
    if raised and not quiet:
        raise raised[0]
    return _ROOT_CACHE.get(key)


#: a directory the evaluator processes of one search share (`executor.LocalPool` makes it, hands it to its slots and
#: removes it), where, on the CPU, the first of them to need the root's probe results writes them and the others read
#: them: the same trusted child's results, computed once per search instead of once per process (attention's CPU
#: probes: ~4 s of interpreter on the cores the processes share). Only on the CPU: on a GPU each process runs on
#: its own device, and its root child also fills the trusted Triton cache its candidates are seeded from
ROOT_SHARE: Path | None = None


def _shared_root(share: Path, key: tuple, plan: Plan,
                 compute: Callable[[], dict[str, ProbeResult]]) -> tuple[dict[str, ProbeResult], bool]:
    """(the root's results for `key`, whether they came from `share`): read from there when another process wrote
    them, else computed and written (under a lock per key: a process that needs them while another computes them
    waits for those). An entry that cannot be read is computed again; one that cannot be written only costs the
    other processes their own computation."""
    import fcntl

    name = hashlib.sha256(repr((key, evaluator_fingerprint())).encode()).hexdigest()[:40]
    with open(share / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _read_root(share / name, plan), True
        except (OSError, ValueError, KeyError, TypeError, ProtocolError):
            pass
        root = compute()
        try:
            _write_root(share / name, root)
        except OSError:
            pass
        return root, False


def _write_root(path: Path, results: dict[str, ProbeResult]) -> None:
    """`results` as `path`.json (which probe has which tensors) and `path`.bin (the tensors, `TensorWriter`),
    the JSON renamed into place last."""
    w = TensorWriter(path.with_suffix(".bin"))
    doc = {pid: {"error": r.error, "outputs": [w.ref(t) for t in r.outputs],
                 "inputs_after": None if r.inputs_after is None else [w.ref(t) for t in r.inputs_after]}
           for pid, r in results.items()}
    part = path.with_suffix(".part")
    part.write_text(json.dumps({"probes": doc, "tensors": w.close()}))
    os.replace(part, path.with_suffix(".json"))


def _read_root(path: Path, plan: Plan) -> dict[str, ProbeResult]:
    doc = json.loads(path.with_suffix(".json").read_text())
    tensors = read_tensors(path.with_suffix(".bin"), doc["tensors"])
    if set(doc["probes"]) != {p.id for p in plan.probes}:
        raise ProtocolError("shared root results do not match the plan's probes")
    return {pid: ProbeResult(outputs=[tensors[i] for i in index_list(r["outputs"], len(tensors), pid)],
                             inputs_after=None if r["inputs_after"] is None
                             else [tensors[i] for i in index_list(r["inputs_after"], len(tensors), pid)],
                             error=r["error"])
            for pid, r in doc["probes"].items()}


def run_probes(plan: Plan, impl: Path, device: str, timeout: float, trusted: bool = False,
               library: bool = False, phases: dict | None = None,
               prefix: str = "probes_candidate") -> tuple[dict[str, ProbeResult] | None, str | None]:
    """Run every probe of `plan` on `impl` in a child. (results, None) or (None, one-line failure).

    `trusted` (the root only): the child compiles into the process's shared Triton cache, which every other
    GPU child gets a private copy of (`sandbox.triton_cache`). `library`: `impl` is the library's own root
    (it may run where the jail does not start). `phases`: where the time went goes there (`probe_phases`)."""
    job, write_inputs, read_result = probes_job(plan, impl, device, timeout)
    cache = "private" if not device.startswith("cuda") else "trusted" if trusted else "candidate"
    return probe_outcome(run_child(job, write_inputs, read_result, timeout, cache=cache, trusted=library),
                         phases, prefix)


def probe_outcome(outcome: ChildOutcome, phases: dict | None = None,
                  prefix: str = "probes_candidate") -> tuple[dict[str, ProbeResult] | None, str | None]:
    if outcome.failure:
        if phases is not None and "forked" in outcome.phases:  # how the child started, whatever became of it
            phases[f"{prefix}_forked"] = outcome.phases["forked"]
        return None, outcome.failure
    kind, value, stats = outcome.doc
    if phases is not None:
        phases.update(probe_phases(outcome.phases, stats, prefix))
    if kind == "import":
        return None, f"import failed: {value}"
    return value, None


#: the parts of a probes job the child reports (`child.run_probes_job`), in its own clock: "start" (from the job
#: taken to its inputs: a fresh child's imports), "inputs" (read and decoded), "import" (the implementation),
#: "compute" (the probes, their outputs copied to the CPU), "graph" (the CUDA graph replays), "send" (outputs written),
#: "boot_wait" (a pre-started child's: how long its job waited for its start to end)
CHILD_PHASES = ("start", "inputs", "import", "ahead", "compute", "graph", "send", "boot_wait")


def probe_phases(parent: dict, stats: dict, prefix: str) -> dict[str, float]:
    """A probes phase broken down: the parent's parts (`spawn.ChildOutcome.phases`), the child's (`CHILD_PHASES`;
    what the child says, so diagnostics only: nothing is decided on them, and a value that is not a plausible
    number of seconds is dropped), `_wait_other` (the parent's wait less the child's parts: a fresh child's
    interpreter start, polling, the reply's JSON), the megabytes each way (`_in_mb`, `_out_mb`) and how many entries
    the child added to its Triton cache (`_compiled`, a count: kernels and launchers it compiled, inside
    `_child_compute`) and whether the fork server forked the child (`_forked`, 1.0 or 0.0)."""
    out = {f"{prefix}_{k}": v for k, v in parent.items() if k in ("start", "inputs", "read", "forked")}
    child = stats.get("child") if isinstance(stats.get("child"), dict) else {}
    told = {k: float(v) for k, v in child.items() if k in CHILD_PHASES and type(v) in (int, float)
            and 0 <= v < 1e5}
    out.update({f"{prefix}_child_{k}": v for k, v in told.items()})
    compiled = child.get("compiled")
    if type(compiled) is int and 0 <= compiled < 10**6:  # a count, not seconds: kernels the child compiled
        out[f"{prefix}_compiled"] = float(compiled)
    for k in ("ahead_compiled", "ahead_kernels", "ahead_cached", "ahead_workers", "ahead_failed"):  # counts too
        if type(child.get(k)) is int and 0 <= child[k] < 10**6:  # (`ahead.compile_ahead`)
            out[f"{prefix}_{k}"] = float(child[k])
    for k in ("ahead_record_s", "ahead_wait_s"):  # seconds: the dry run (inside _child_ahead), the probes' waits for
        if type(child.get(k)) in (int, float) and 0 <= child[k] < 1e5:  # the workers (inside _child_compute)
            out[f"{prefix}_{k}"] = float(child[k])
    if "wait" in parent:
        out[f"{prefix}_wait_other"] = max(0.0, parent["wait"] - sum(told.values()))
    out[f"{prefix}_in_mb"] = stats.get("in_bytes", 0) / 1e6
    out[f"{prefix}_out_mb"] = stats.get("out_bytes", 0) / 1e6
    return out


def probes_job(plan: Plan, impl: Path, device: str, limit_s: float) -> tuple[dict, Callable, Callable]:
    """(job, write_inputs, read_result) of a child running every probe of `plan` on `impl` (`spawn.run_child`);
    `limit_s` sizes the child's resource limits (`sandbox.limits`)."""

    sent: list[torch.Tensor] = []  # the tensors written to the child, by input index
    stats: dict[str, Any] = {}  # bytes each way and the child's own phases (`probe_phases`)
    servers: list = []  # the socket the child hands its sealed outputs over on (`protocol.SharedOutputs`)

    def write_inputs(tmp: Path) -> dict:
        """The probes' tensors into `tmp/inputs.bin` (a directory the child reads and cannot write): a plan this
        process keeps (`plan_for`) is written once and linked (its linear GPU plan is 1.9 GB), any other now."""
        if _kept(plan):
            kept = _link_inputs(plan, tmp / "inputs.bin")
            probes, entries, tensors = kept.probes, kept.entries, kept.sent
        else:
            probes, entries, tensors = _write_probes(plan, tmp / "inputs.bin")
        sent.extend(tensors)
        stats["in_bytes"] = (tmp / "inputs.bin").stat().st_size
        srv = listen_shared(tmp)  # tmp/reply.sock, where the sandbox tells the child it is
        if srv is not None:
            servers.append(srv)
        return {"probes": probes, "tensors": entries}

    def outputs(out: Path, doc: dict) -> list[torch.Tensor]:
        """The reply's tensors: mapped from the sealed memfd the child handed over (bytes nothing can change any
        more), or read from its file as a copy (a live child could still write the file)."""
        try:
            if doc.get("via") == "memfd":
                if not servers:
                    raise ProtocolError("outputs in shared memory, but none was offered")
                data = receive_shared(servers[-1])
                stats["out_bytes"] = len(data)
                return tensors_from(data, doc.get("tensors"))
            stats["out_bytes"] = (out / "outputs.bin").stat().st_size if (out / "outputs.bin").is_file() else 0
            return read_tensors(out / "outputs.bin", doc.get("tensors"))
        finally:
            for srv in servers:
                srv.close()

    def echoed(x: Any, tensors: list[torch.Tensor], pid: str) -> list[torch.Tensor]:
        """inputs_after: a tensor sent back, or {"input": k}: "input k, bitwise as it was sent"."""
        if not isinstance(x, list) or len(x) > 4096:
            raise ProtocolError(f"{pid}: inputs_after is not a list")
        out = []
        for v in x:
            if isinstance(v, dict) and set(v) == {"input"}:
                out.append(sent[tensor_index(v["input"], len(sent), pid)])
            else:
                out.append(tensors[tensor_index(v, len(tensors), pid)])
        return out

    def read_result(out: Path, doc: dict) -> Any:
        stats["child"] = doc.get("phases")
        if doc.get("import_error") is not None:
            return ("import", str(doc["import_error"])[:300], stats)
        tensors = outputs(out, doc)
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
            after = echoed(r["inputs_after"], tensors, pid) if r["inputs_after"] is not None else None
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
        return ("ok", results, stats)

    job = {"mode": "probes", "impl": str(impl.resolve()), "device": device, "limits": limits(limit_s),
           "graph_probes": graph_probe_ids(plan) if device.startswith("cuda") else [], "compile_ahead": _AHEAD.ENABLED}
    return job, write_inputs, read_result


def graph_probe_ids(plan: Plan) -> list[str]:
    """The probes replayed through a CUDA graph: the first forward probe of each entry that echoes its inputs."""
    seen, ids = set(), []
    for p in plan.probes:
        if p.echo_inputs and not p.grad_args and p.entry not in seen:
            seen.add(p.entry)
            ids.append(p.id)
    return ids


