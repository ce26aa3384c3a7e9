"""Contracts as data: what an implementation of an operator must satisfy, and where it is timed.

A `Contract` is frozen, trusted code. It never imports an implementation file; it builds a
`Plan` — a list of `Probe`s (calls to make on the implementation, with their inputs) and a
list of `Check`s (functions of the probes' outputs, evaluated by the trusted side). The
same plan runs in-process (`run_plan`, used by the library's own tests) or across a process
boundary (`tik_kernels.evaluator`, where the candidate only ever sees the probes' inputs).

Results are keyed by probe id. A probe's outputs are the entry point's return value
flattened to a list of tensors, then the gradients of the probe's `grad_args` in order.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import math
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Requirement:
    """One numerical promise an implementation makes (a row of the contract)."""

    name: str
    kind: str  # bitwise | determinism | inputs_unchanged | accuracy | gradient | root_bits | custom
    description: str


@dataclass(frozen=True)
class Tolerance:
    """Accuracy against a float64 reference: relative RMS error, and optionally max-abs error."""

    rel_rms: float
    max_abs: float | None = None


@dataclass(frozen=True)
class Cell:
    """A workload cell: one shape the operator is timed on, weighted in the objective."""

    name: str
    params: Mapping[str, Any]
    coeff: float = 1.0
    #: a candidate is admissible only if no cell is slower than root × (1 + limit)
    limit: float = 0.05


@dataclass
class BenchCase:
    """What the timing harness calls for one cell. The harness owns the shapes."""

    entry: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    #: the stock-PyTorch counterpart on the same inputs (cuBLAS matmul, F.rms_norm, ...)
    baseline: Callable[[], Any] | None = None
    #: fewest bytes the op must move (each input read once, output written once), for GB/s
    bytes_moved: int | None = None
    flops: int | None = None
    #: positional arguments whose dim 0 is the token dim (every output's dim 0 is too, and a token's outputs
    #: depend on its own rows only): the harness then recomputes a few timed rows alone and in a small batch,
    #: and the parent requires them bitwise equal to the timed call's rows (`measure.timed_rows_ok`), so a
    #: shape that is timed is also bit-checked. Empty: not token-wise, not checked that way.
    token_args: tuple[int, ...] = ()


@dataclass
class Probe:
    """One call to make on an implementation: `module.<entry>(*args, **kwargs)`.

    Tensors in `args` are CPU tensors owned by the trusted side; runners copy them to the
    device, so a candidate can never mutate the originals. With `grad_args`, those positional
    arguments require grad and the runner back-propagates `grad_outputs` (one per output).
    """

    id: str
    entry: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    grad_args: tuple[int, ...] = ()
    grad_outputs: tuple[torch.Tensor, ...] | None = None
    #: return the tensor arguments as they are after the call (for the inputs-unchanged check)
    echo_inputs: bool = False


@dataclass
class ProbeResult:
    outputs: list[torch.Tensor] = field(default_factory=list)
    inputs_after: list[torch.Tensor] | None = None
    error: str | None = None


@dataclass
class CheckResult:
    name: str
    requirement: str
    passed: bool
    detail: str
    max_diff: float | None = None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "requirement": self.requirement,
            "passed": self.passed,
            "detail": self.detail,
            "max_diff": self.max_diff,
        }


class ProbeFailed(Exception):
    """Raised inside a check when a probe it needs has no usable result."""


class Results:
    """Probe outputs seen by checks: `res[probe_id]` for the candidate, `res.root(probe_id)` for the root."""

    def __init__(self, cand: Mapping[str, ProbeResult], root: Mapping[str, ProbeResult] | None = None):
        self._cand = cand
        self._root = root

    def _get(self, table: Mapping[str, ProbeResult] | None, pid: str, who: str) -> list[torch.Tensor]:
        if table is None or pid not in table:
            raise ProbeFailed(f"{who} probe {pid} was not run")
        r = table[pid]
        if r.error is not None:
            raise ProbeFailed(f"{who} probe {pid} failed: {r.error}")
        return r.outputs

    def __getitem__(self, pid: str) -> list[torch.Tensor]:
        return self._get(self._cand, pid, "candidate")

    def root(self, pid: str) -> list[torch.Tensor]:
        return self._get(self._root, pid, "root")

    def inputs_after(self, pid: str) -> list[torch.Tensor] | None:
        self[pid]
        return self._cand[pid].inputs_after


#: a check returns (passed, detail) or (passed, detail, max_diff)
CheckFn = Callable[[Results], tuple]


@dataclass
class Check:
    name: str
    requirement: str
    fn: CheckFn

    def run(self, res: Results) -> CheckResult:
        try:
            out = self.fn(res)
        except ProbeFailed as e:
            return CheckResult(self.name, self.requirement, False, str(e))
        except Exception as e:  # a check that breaks on odd outputs is a failed check, not a crash
            return CheckResult(self.name, self.requirement, False, f"check raised {type(e).__name__}: {e}")
        passed, detail = bool(out[0]), str(out[1])
        max_diff = float(out[2]) if len(out) > 2 and out[2] is not None else None
        return CheckResult(self.name, self.requirement, passed, detail, max_diff)


@dataclass
class Plan:
    probes: list[Probe] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    #: some checks compare with the root implementation's outputs on the same probes
    needs_root: bool = False

    def add(self, probe: Probe) -> str:
        if any(p.id == probe.id for p in self.probes):
            raise ValueError(f"duplicate probe id {probe.id}")
        self.probes.append(probe)
        return probe.id

    def check(self, name: str, requirement: str, fn: CheckFn) -> None:
        self.checks.append(Check(name, requirement, fn))

    def extend(self, other: Plan) -> None:
        for p in other.probes:
            self.add(p)
        self.checks.extend(other.checks)
        self.needs_root = self.needs_root or other.needs_root


@dataclass
class Contract:
    """An operator's contract. One module per operator in `tik_kernels/contracts/` defines `CONTRACT`."""

    op: str
    entries: tuple[str, ...]
    #: import path of the library's root implementation file, e.g. "tik_kernels.ops.rmsnorm"
    impl: str
    summary: str
    requirements: tuple[Requirement, ...]
    tolerances: Mapping[str, Tolerance]
    #: build_plan(profile, seed) -> Plan; profile is "cpu" (interpreter, tiny shapes) or "gpu"
    build_plan: Callable[[str, int], Plan]
    #: cells(profile) -> workload cells
    cells: Callable[[str], list[Cell]]
    #: bench_case(cell, seed, device) -> BenchCase
    bench_case: Callable[[Cell, int, str], BenchCase]
    preserve_root_bits: bool = False
    #: TUNABLES the contract forbids a derivation from changing (they change the reduction order)
    frozen_tunables: frozenset[str] = frozenset()
    used_in_training: bool = True

    def __post_init__(self) -> None:
        # every plan of an operator used in training gets `with_grad_mode_check`: its requirement is listed too
        if self.used_in_training and GRAD_MODE_REQUIREMENT.name not in {r.name for r in self.requirements}:
            self.requirements = (*self.requirements, GRAD_MODE_REQUIREMENT)

    @property
    def root_path(self) -> Path:
        spec = importlib.util.find_spec(self.impl)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"root implementation {self.impl} not found")
        return Path(spec.origin)

    def plan(self, profile: str, seed: int) -> Plan:
        plan = self.build_plan(profile, seed)
        for c in plan.checks:
            if c.requirement not in {r.name for r in self.requirements}:
                raise ValueError(f"{self.op}: check {c.name} names unknown requirement {c.requirement}")
        if self.used_in_training:
            with_grad_mode_check(plan)
        return plan

    def fingerprint(self) -> str:
        """Hash of every frozen module the contract reaches: its own source, this framework, and whatever in
        `tik_kernels` they import, transitively (references, model shapes, shared contract helpers). A result is
        bound to it: editing a reference or a model's shape changes it as surely as editing the contract."""
        mod = inspect.getmodule(self.build_plan)
        starts = [m for m in (mod, inspect.getmodule(Contract)) if m is not None and getattr(m, "__file__", None)]
        h = hashlib.sha256()
        for path in reached_sources([Path(m.__file__) for m in starts]):
            h.update(path.name.encode())
            h.update(path.read_bytes())
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        return {
            "op": self.op,
            "entries": list(self.entries),
            "impl": self.impl,
            "summary": self.summary,
            "preserve_root_bits": self.preserve_root_bits,
            "frozen_tunables": sorted(self.frozen_tunables),
            "requirements": [r.__dict__ for r in self.requirements],
            "tolerances": {k: v.__dict__ for k, v in self.tolerances.items()},
        }


# ----------------------------------------------------------------------------- the sources a contract reaches

#: the package whose modules a fingerprint follows (everything else is the environment's: torch, triton, ...)
_PACKAGE = "tik_kernels"
_REACHED: dict[tuple, list[Path]] = {}


def _imported_names(tree: ast.AST, package: str) -> set[str]:
    """Every module an import statement in `tree` may load (`from a import b` may load a.b), relative ones
    resolved against `package`, the parent packages included (importing a.b.c runs a and a.b first)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    out = set()
    for n in names:
        parts = n.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return {n for n in out if n == _PACKAGE or n.startswith(_PACKAGE + ".")}


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # `from pkg import function`: pkg.function is no module
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).resolve()


def _module_name(path: Path) -> str:
    """The dotted name of a file inside this package (a file outside it: its stem, it has no package)."""
    root = Path(__file__).resolve().parent
    try:
        rel = path.relative_to(root.parent)
    except ValueError:
        return path.stem
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def reached_sources(starts: Sequence[Path]) -> list[Path]:
    """The source files of `starts` and of every `tik_kernels` module they import, transitively, sorted.
    Kept per start set while no file of it changed (a changed file may import something new)."""
    key = tuple(str(p.resolve()) for p in starts)
    hit = _REACHED.get(key)
    if hit is not None:
        files, stamps = hit
        try:
            if [(f.stat().st_mtime_ns, f.stat().st_size) for f in files] == stamps:
                return files
        except OSError:
            pass
    seen: dict[Path, None] = {}
    todo = [(p.resolve(), None) for p in starts]
    while todo:
        path, name = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        if name is None:
            name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_bytes(), str(path))
        for dep in sorted(_imported_names(tree, package)):
            f = _module_file(dep)
            if f is not None and f not in seen:
                todo.append((f, dep))
    files = sorted(seen, key=str)
    _REACHED[key] = (files, [(f.stat().st_mtime_ns, f.stat().st_size) for f in files])
    return files


# ----------------------------------------------------------------------------- comparisons


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor as an integer tensor of the same element size."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.contiguous().view(view)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and raw bits (NaN payloads, -0.0): `bitwise_equal` without the detail."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(_bits(a.cpu()), _bits(b.cpu())))


def bitwise_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> tuple[bool, str, float | None]:
    """Exact equality of raw bits (NaN payloads included). Returns (passed, detail, max_abs_diff)."""
    prefix = f"{what}: " if what else ""
    if a.shape != b.shape:
        return False, f"{prefix}shape {tuple(a.shape)} != {tuple(b.shape)}", None
    if a.dtype != b.dtype:
        return False, f"{prefix}dtype {a.dtype} != {b.dtype}", None
    ba, bb = _bits(a), _bits(b)
    neq = ba != bb
    n = int(neq.sum())
    if n == 0:
        return True, f"{prefix}{a.numel()} elements bitwise equal", 0.0
    diff = float((a.double() - b.double()).abs().nan_to_num(nan=math.inf).max()) if a.is_floating_point() else None
    where = neq.nonzero()[0].tolist()
    return False, f"{prefix}{n}/{a.numel()} elements differ (first at {where}, max |diff| {diff:.3g})", diff


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max-abs error, relative RMS error) of `out` against a float64 `ref`."""
    o, r = out.double(), ref.double()
    d = o - r
    max_abs = float(d.abs().max()) if d.numel() else 0.0
    rms_ref = float(r.pow(2).mean().sqrt()) if r.numel() else 0.0
    rel = float(d.pow(2).mean().sqrt()) / max(rms_ref, 1e-30) if d.numel() else 0.0
    if not torch.isfinite(o).all():
        return math.inf, math.inf
    return max_abs, rel


def accurate(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, what: str = "") -> tuple[bool, str, float]:
    """Accuracy against float64: relative RMS (and max-abs when stated) within `tol`; NaN never passes."""
    prefix = f"{what}: " if what else ""
    if out.shape != ref.shape:
        return False, f"{prefix}shape {tuple(out.shape)} != reference {tuple(ref.shape)}", math.inf
    max_abs, rel = error_stats(out, ref)
    ok = rel <= tol.rel_rms and (tol.max_abs is None or max_abs <= tol.max_abs)
    bound = f"rel_rms<={tol.rel_rms:g}" + (f", max_abs<={tol.max_abs:g}" if tol.max_abs is not None else "")
    return ok, f"{prefix}rel_rms {rel:.3g}, max_abs {max_abs:.3g} ({bound})", max_abs


# ----------------------------------------------------------------------------- generic checks of every plan

#: what `with_grad_mode_check` holds every operator used in training to
GRAD_MODE_REQUIREMENT = Requirement(
    "grad_mode_invariance", "bitwise",
    "the forward under autograd (inputs requiring grad) has the bits of the forward under no_grad: "
    "the trainer's forward is the rollout's")


def _same_arg(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and same_bits(a, b)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an argument without a usable ==: not the same call
        return False


def _same_call(p: Probe, q: Probe) -> bool:
    return (p.entry == q.entry and len(p.args) == len(q.args) and set(p.kwargs) == set(q.kwargs)
            and all(_same_arg(a, b) for a, b in zip(p.args, q.args, strict=True))
            and all(_same_arg(p.kwargs[k], q.kwargs[k]) for k in p.kwargs))


def with_grad_mode_check(plan: Plan) -> Plan:
    """Every backward probe's forward outputs (computed with grad enabled, its grad_args requiring grad) must have
    the bits of the same call under no_grad. Training (mode B) recomputes with autograd the forward the rollout
    ran without it; an implementation that switches on `torch.is_grad_enabled()` or `requires_grad` would pass
    every accuracy bound and still break the bitwise equality between them. The no_grad call is a probe the plan
    already makes on the same arguments where there is one, else a new one."""
    for p in [p for p in plan.probes if p.grad_args]:
        twin = next((q for q in plan.probes if not q.grad_args and _same_call(p, q)), None)
        if twin is None:
            twin = Probe(p.id + "@no_grad", p.entry, p.args, dict(p.kwargs))
            plan.add(twin)

        def fn(res: Results, g: str = p.id, f: str = twin.id) -> tuple:
            plain, under = res[f], res[g]
            if len(under) < len(plain):
                return False, f"{len(under)} outputs and gradients with grad enabled, {len(plain)} outputs without"
            for k, (x, y) in enumerate(zip(under[: len(plain)], plain, strict=True)):
                ok, detail, d = bitwise_equal(x, y, f"output {k}")
                if not ok:
                    return False, "forward with grad enabled differs from no_grad: " + detail, d
            return True, f"{len(plain)} outputs bitwise equal with grad enabled and under no_grad", 0.0

        plan.check(f"grad_mode_invariance[{p.id}]", GRAD_MODE_REQUIREMENT.name, fn)
    return plan


# ----------------------------------------------------------------------------- running a plan in-process


def flatten_outputs(value: Any) -> list[torch.Tensor]:
    """An entry point's return value as a list of plain dense tensors; anything else is an error."""
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    out = []
    for i, t in enumerate(items):
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise TypeError(f"output {i} is {type(t).__name__}, not a plain torch.Tensor")
        if t.layout != torch.strided:
            raise TypeError(f"output {i} has layout {t.layout}, not strided")
        if t.is_meta:
            raise TypeError(f"output {i} is a meta tensor")
        out.append(t)
    return out


def _to_device(v: Any, device: str, requires_grad: bool = False) -> Any:
    if isinstance(v, torch.Tensor):
        t = v.detach().to(device, copy=True)
        if requires_grad:
            t.requires_grad_(True)
        return t
    return v


def execute_probe(module: ModuleType, probe: Probe, device: str) -> ProbeResult:
    """Run one probe on `module` and return CPU copies of its outputs. Used in-process and by the child."""
    fn = getattr(module, probe.entry, None)
    if not callable(fn):
        return ProbeResult(error=f"entry point {probe.entry}() missing")
    # a fresh allocation of random size first, so tensor addresses differ run to run
    pad = torch.empty(random.randint(1, 4096) * 64, dtype=torch.uint8, device=device)
    args = tuple(_to_device(a, device, i in probe.grad_args) for i, a in enumerate(probe.args))
    kwargs = {k: _to_device(v, device) for k, v in probe.kwargs.items()}
    try:
        with torch.set_grad_enabled(bool(probe.grad_args)):
            outs = flatten_outputs(fn(*args, **kwargs))
            if probe.grad_args:
                gos = probe.grad_outputs or tuple(torch.ones_like(o) for o in outs)
                pairs = [(o, g) for o, g in zip(outs, gos, strict=False) if g is not None and o.requires_grad]
                if not pairs:
                    raise RuntimeError("outputs do not require grad: no backward")
                torch.autograd.backward([o for o, _ in pairs], [g.to(device) for _, g in pairs])
                grads = []
                for i in probe.grad_args:
                    g = args[i].grad
                    grads.append(g if g is not None else torch.zeros_like(args[i]))
                outs = [o.detach() for o in outs] + grads
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        result = ProbeResult(outputs=[o.detach().to("cpu", copy=True) for o in outs])
        if probe.echo_inputs:
            result.inputs_after = [a.detach().to("cpu", copy=True) for a in args if isinstance(a, torch.Tensor)]
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result = ProbeResult(error=f"{type(e).__name__}: {msg}"[:300])
    del pad
    return result


def run_probes(module: ModuleType, probes: Sequence[Probe], device: str) -> dict[str, ProbeResult]:
    return {p.id: execute_probe(module, p, device) for p in probes}


def load_module(path: str | Path, name: str = "tik_candidate") -> ModuleType:
    """Import an implementation file by path (a fresh module object each call)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    # registered only while its body runs: dataclasses (Python 3.12) looks a class's string annotations
    # up through sys.modules[cls.__module__] and failed on an unregistered module (every linear timing
    # run on the H200 died in contracts/linear.py's dataclass). Left registered, a later load under the
    # same name would replace an earlier one that Triton's interpreter still resolves through it.
    previous = sys.modules.get(name)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    return mod


def run_plan(
    plan: Plan,
    module: ModuleType,
    root_module: ModuleType | None = None,
    device: str | None = None,
) -> list[CheckResult]:
    """Run a plan in this process (trusted implementations only: the library's tests use this)."""
    from tik_kernels._runtime import DEVICE

    device = device or DEVICE
    cand = run_probes(module, plan.probes, device)
    root = None
    if plan.needs_root:
        root = run_probes(root_module or module, plan.probes, device) if root_module is not None else None
    return evaluate_checks(plan, cand, root)


def evaluate_checks(
    plan: Plan, cand: Mapping[str, ProbeResult], root: Mapping[str, ProbeResult] | None
) -> list[CheckResult]:
    res = Results(cand, root)
    return [c.run(res) for c in plan.checks]


# ----------------------------------------------------------------------------- the token-wise plan


@dataclass
class TokenwiseConfig:
    """One input configuration of a token-wise operator (e.g. one model's hidden size).

    `make_inputs(T, gen)` returns the positional arguments for T tokens, built on the CPU from
    `gen`; `token_args` are the positions whose dim 0 is the token dim (the rest are shared,
    e.g. weights). `reference(*args)` gets the same arguments upcast to float64 (integer
    tensors unchanged) and returns the float64 outputs. `grad_args` are positions that get
    gradients (checked against autograd through `reference`).
    """

    name: str
    make_inputs: Callable[[int, torch.Generator], tuple]
    token_args: tuple[int, ...]
    reference: Callable[..., Any] | None = None
    tolerance: Tolerance | None = None
    grad_args: tuple[int, ...] = ()
    grad_tolerance: Tolerance | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def gather_rows(args: tuple, token_args: Sequence[int], idx: torch.Tensor) -> tuple:
    return tuple(a[idx] if i in token_args else a for i, a in enumerate(args))


def cat_rows(parts: Sequence[tuple], token_args: Sequence[int]) -> tuple:
    first = parts[0]
    return tuple(torch.cat([p[i] for p in parts]) if i in token_args else first[i] for i in range(len(first)))


def upcast64(args: tuple) -> tuple:
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def reference_outputs(cfg: TokenwiseConfig, args: tuple) -> list[torch.Tensor]:
    return flatten_outputs(cfg.reference(*upcast64(args)))


def reference_grads(cfg: TokenwiseConfig, args: tuple, grad_outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    a64 = list(upcast64(args))
    for i in cfg.grad_args:
        a64[i] = a64[i].detach().clone().requires_grad_(True)
    outs = flatten_outputs(cfg.reference(*a64))
    pairs = [(o, g.double()) for o, g in zip(outs, grad_outputs, strict=False) if g is not None]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [a64[i].grad for i in cfg.grad_args]


def tokenwise_plan(
    entry: str,
    configs: Sequence[TokenwiseConfig],
    sizes: Sequence[int],
    seed: int,
    *,
    preserve_root_bits: bool = False,
) -> Plan:
    """The standard plan of an operator whose result for a token depends only on that token's row.

    For each config: a full batch of T = max(sizes) rows; subsets of every size in `sizes`
    drawn in random order; the full batch permuted; rows repeated; two sequences packed
    back to back vs the same sequences padded with unrelated rows; a rerun (determinism);
    inputs unchanged; accuracy of the full batch against float64; gradients against float64.
    Each subset's output rows must equal the full batch's rows, raw bits.
    Requirement names used: batch_invariance, determinism, inputs_unchanged, accuracy, gradient,
    and root_bits when `preserve_root_bits`.
    """
    plan = Plan(needs_root=preserve_root_bits)
    rng = random.Random(seed)
    for cfg in configs:
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        T = max(sizes)
        pool = cfg.make_inputs(2 * T, gen)
        full = gather_rows(pool, cfg.token_args, torch.arange(T))
        extra = gather_rows(pool, cfg.token_args, torch.arange(T, 2 * T))
        p = f"{cfg.name}/"
        full_id = plan.add(Probe(p + f"full[T={T}]", entry, full, dict(cfg.kwargs), echo_inputs=True))
        again = plan.add(Probe(p + "rerun", entry, full, dict(cfg.kwargs)))

        def rows_equal(sub_id: str, idx: torch.Tensor, label: str, full_id: str = full_id, p: str = p) -> None:
            def fn(res: Results) -> tuple:
                sub, ref = res[sub_id], res[full_id]
                if len(sub) != len(ref):
                    return False, f"{len(sub)} outputs, expected {len(ref)}"
                worst = 0.0
                for k, (s, r) in enumerate(zip(sub, ref, strict=True)):
                    ok, detail, d = bitwise_equal(s, r[idx], f"output {k}")
                    if not ok:
                        return False, detail, d
                    worst = max(worst, d or 0.0)
                return True, f"{len(idx)} rows bitwise equal to the full batch's", worst

            plan.check(p + label, "batch_invariance", fn)

        for n in sorted(set(sizes)):
            if n == T:
                continue
            idx = torch.randperm(T, generator=gen)[:n]
            sid = plan.add(Probe(p + f"subset[T={n}]", entry, gather_rows(full, cfg.token_args, idx), dict(cfg.kwargs)))
            rows_equal(sid, idx, f"batch_invariance[T={n}]")
        perm = torch.randperm(T, generator=gen)
        sid = plan.add(Probe(p + "permuted", entry, gather_rows(full, cfg.token_args, perm), dict(cfg.kwargs)))
        rows_equal(sid, perm, "batch_invariance[permuted]")
        rep = torch.randint(0, T, (T,), generator=gen)
        sid = plan.add(Probe(p + "repeated", entry, gather_rows(full, cfg.token_args, rep), dict(cfg.kwargs)))
        rows_equal(sid, rep, "batch_invariance[repeated rows]")

        # packed: sequences A and B back to back (rows 0..a+b of full); padded: each followed by pad rows
        a = max(1, T // 3)
        b = max(1, T - a - max(1, T // 4))
        pad = max(1, T - a - b)
        padded = cat_rows(
            [
                gather_rows(full, cfg.token_args, torch.arange(0, a)),
                gather_rows(extra, cfg.token_args, torch.arange(0, pad)),
                gather_rows(full, cfg.token_args, torch.arange(a, a + b)),
                gather_rows(extra, cfg.token_args, torch.arange(pad, 2 * pad)),
            ],
            cfg.token_args,
        )
        sid = plan.add(Probe(p + "padded", entry, padded, dict(cfg.kwargs)))
        pos = torch.cat([torch.arange(0, a), torch.arange(a + pad, a + pad + b)])

        def packed_vs_padded(res: Results, sid: str = sid, pos: torch.Tensor = pos, full_id: str = full_id, a=a, b=b):
            n = a + b
            for k, (s, r) in enumerate(zip(res[sid], res[full_id], strict=True)):
                ok, detail, d = bitwise_equal(s[pos], r[:n], f"output {k}")
                if not ok:
                    return False, detail, d
            return True, f"packed rows ({a}+{b}) bitwise equal to padded rows", 0.0

        plan.check(p + "packed_vs_padded", "batch_invariance", packed_vs_padded)

        def determinism(res: Results, again: str = again, full_id: str = full_id):
            for k, (x, y) in enumerate(zip(res[again], res[full_id], strict=True)):
                ok, detail, d = bitwise_equal(x, y, f"output {k}")
                if not ok:
                    return False, "rerun differs: " + detail, d
            return True, "rerun bitwise identical", 0.0

        plan.check(p + "determinism", "determinism", determinism)

        def unchanged(res: Results, full: tuple = full, full_id: str = full_id):
            after = res.inputs_after(full_id) or []
            sent = [a for a in full if isinstance(a, torch.Tensor)]
            if len(after) != len(sent):
                return False, "inputs were not echoed"
            for k, (x, y) in enumerate(zip(after, sent, strict=True)):
                ok, detail, _ = bitwise_equal(x, y, f"input {k}")
                if not ok:
                    return False, "input mutated: " + detail
            return True, f"{len(sent)} inputs bitwise unchanged"

        plan.check(p + "inputs_unchanged", "inputs_unchanged", unchanged)

        if cfg.reference is not None and cfg.tolerance is not None:
            refs = reference_outputs(cfg, full)

            def accuracy(res: Results, refs=refs, tol=cfg.tolerance, full_id: str = full_id):
                outs = res[full_id]
                if len(outs) != len(refs):
                    return False, f"{len(outs)} outputs, reference has {len(refs)}"
                worst, details = 0.0, []
                for k, (o, r) in enumerate(zip(outs, refs, strict=True)):
                    ok, detail, d = accurate(o, r, tol, f"output {k}")
                    if not ok:
                        return False, detail, d
                    worst, details = max(worst, d), details + [detail]
                return True, "; ".join(details), worst

            plan.check(p + "accuracy", "accuracy", accuracy)

        if cfg.grad_args and cfg.reference is not None:
            ref_outs = reference_outputs(cfg, full)
            gos = tuple(torch.randn(o.shape, generator=gen, dtype=torch.float32) for o in ref_outs)
            probe_gos = tuple(g.to(full[cfg.token_args[0]].dtype) if full[cfg.token_args[0]].is_floating_point()
                              else g for g in gos)
            gid = plan.add(Probe(p + "backward", entry, full, dict(cfg.kwargs), grad_args=cfg.grad_args,
                                 grad_outputs=probe_gos))
            ref_g = reference_grads(cfg, full, [g.double() for g in probe_gos])
            gtol = cfg.grad_tolerance or cfg.tolerance
            n_out = len(ref_outs)

            def gradient(res: Results, gid=gid, ref_g=ref_g, gtol=gtol, n_out=n_out, grad_args=cfg.grad_args):
                got = res[gid][n_out:]
                if len(got) != len(ref_g):
                    return False, f"{len(got)} gradients, expected {len(ref_g)}"
                worst, details = 0.0, []
                for i, g, r in zip(grad_args, got, ref_g, strict=True):
                    ok, detail, d = accurate(g, r, gtol, f"grad of arg {i}")
                    if not ok:
                        return False, detail, d
                    worst, details = max(worst, d), details + [detail]
                return True, "; ".join(details), worst

            plan.check(p + "gradient", "gradient", gradient)

        if preserve_root_bits:

            def root_bits(res: Results, full_id: str = full_id):
                for k, (x, y) in enumerate(zip(res[full_id], res.root(full_id), strict=True)):
                    ok, detail, d = bitwise_equal(x, y, f"output {k}")
                    if not ok:
                        return False, "differs from root: " + detail, d
                return True, "bitwise equal to the root implementation", 0.0

            plan.check(p + "root_bits", "root_bits", root_bits)
    return plan


#: the requirements every token-wise plan checks
TOKENWISE_REQUIREMENTS = (
    Requirement("batch_invariance", "bitwise",
                "a token's result has the same bits whatever the other tokens: any T, order, repetition, packing"),
    Requirement("determinism", "determinism", "a rerun on the same inputs gives the same bits"),
    Requirement("inputs_unchanged", "inputs_unchanged", "the call leaves every input bitwise unchanged"),
    Requirement("accuracy", "accuracy", "within the stated tolerance of a float64 reference"),
)
GRADIENT_REQUIREMENT = Requirement("gradient", "gradient", "gradients within tolerance of float64 autograd")
ROOT_BITS_REQUIREMENT = Requirement("root_bits", "root_bits", "outputs bitwise equal to the frozen root's")
