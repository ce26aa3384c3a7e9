"""The data of a contract's plan: requirements, tolerances, cells, probes, checks and their results.

A `Plan` is a list of `Probe`s (calls to make on an implementation, with their inputs) and a list of
`Check`s (functions of the probes' outputs, evaluated by the trusted side). Results are keyed by probe
id. A probe's outputs are the entry point's return value flattened to a list of tensors, then the
gradients of the probe's `grad_args` in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


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
    #: the input variants its timing rotates over (`variants_of`); None: the timing job's. The rotation keeps a
    #: small cell's inputs out of the L2 cache between rounds; a cell whose one input set is many times any GPU's
    #: L2 needs none, and each variant is another copy of it on the device
    variants: int | None = None


def variants_of(cell: Cell, default: int) -> int:
    """The input variants a timing of `cell` rotates over: the cell's own, else the job's `default`; the timing
    child and the parent's check of its seeds both ask here."""
    return cell.variants if cell.variants is not None else default


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
