"""`Contract`: what one operator's contract module defines (`CONTRACT`), its plan with the checks every
plan gets, and its fingerprint."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tik_kernels.contract.grad_mode import GRAD_MODE_REQUIREMENT, with_grad_mode_check
from tik_kernels.contract.model import BenchCase, Cell, Plan, Requirement, Tolerance
from tik_kernels.contract.sources import reached_sources

#: the framework's package file: it imports every module of the package, so a fingerprint reaches them all
FRAMEWORK = Path(__file__).resolve().with_name("__init__.py")


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
        # the file, not the module: a contract file loaded by path (`load_module`) is in no sys.modules entry
        try:
            starts = [Path(inspect.getfile(self.build_plan))]
        except TypeError:  # a builtin has no file
            starts = []
        h = hashlib.sha256()
        for path in reached_sources([*starts, FRAMEWORK]):
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
