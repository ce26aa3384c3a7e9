"""Contracts as data: what an implementation of an operator must satisfy, and where it is timed.

A `Contract` is frozen, trusted code. It never imports an implementation file; it builds a
`Plan` — a list of `Probe`s (calls to make on the implementation, with their inputs) and a
list of `Check`s (functions of the probes' outputs, evaluated by the trusted side). The
same plan runs in-process (`run_plan`, used by the library's own tests) or across a process
boundary (`tik_kernels.evaluator`, where the candidate only ever sees the probes' inputs).

One module per job, each name importable from here:
- `model`      the plan's data: Requirement, Tolerance, Cell, BenchCase, Probe, Check, Plan, results
- `compare`    bit comparisons (`bitwise_equal`, `same_bits`, `inputs_unchanged`) and errors against float64
  (`accurate`)
- `grad_mode`  the check every training operator's plan gets (grad enabled vs no_grad, same bits)
- `sources`    the frozen modules a contract reaches, which its fingerprint hashes
- `spec`       `Contract`, what each `tik_kernels/contracts/<op>.py` defines
- `runner`     importing a file by path (`load_module`), running a probe or a whole plan
- `tokenwise`  the standard plan of a token-wise operator

The modules import each other by their own names, never through this file: it imports them all,
which is also how a contract's fingerprint reaches every one of them (`spec.FRAMEWORK`).
"""

from tik_kernels.contract.compare import accurate, bitwise_equal, error_stats, inputs_unchanged, same_bits
from tik_kernels.contract.grad_mode import GRAD_MODE_REQUIREMENT, with_grad_mode_check
from tik_kernels.contract.model import (
    BenchCase,
    Cell,
    Check,
    CheckFn,
    CheckResult,
    Plan,
    Probe,
    ProbeFailed,
    ProbeResult,
    Requirement,
    Results,
    Tolerance,
    variants_of,
)
from tik_kernels.contract.runner import (
    Staged,
    call_probe,
    evaluate_checks,
    execute_probe,
    flatten_outputs,
    load_module,
    run_plan,
    run_probes,
)
from tik_kernels.contract.sources import reached_sources
from tik_kernels.contract.spec import Contract
from tik_kernels.contract.tokenwise import (
    GRADIENT_REQUIREMENT,
    ROOT_BITS_REQUIREMENT,
    TOKENWISE_REQUIREMENTS,
    TokenwiseConfig,
    cat_rows,
    gather_rows,
    reference_grads,
    reference_outputs,
    tokenwise_plan,
    upcast64,
)

__all__ = [
    "GRADIENT_REQUIREMENT",
    "GRAD_MODE_REQUIREMENT",
    "ROOT_BITS_REQUIREMENT",
    "TOKENWISE_REQUIREMENTS",
    "BenchCase",
    "Cell",
    "Check",
    "CheckFn",
    "CheckResult",
    "Contract",
    "Plan",
    "Probe",
    "ProbeFailed",
    "ProbeResult",
    "Requirement",
    "Results",
    "Tolerance",
    "TokenwiseConfig",
    "accurate",
    "bitwise_equal",
    "Staged",
    "call_probe",
    "cat_rows",
    "error_stats",
    "evaluate_checks",
    "execute_probe",
    "flatten_outputs",
    "gather_rows",
    "inputs_unchanged",
    "load_module",
    "reached_sources",
    "reference_grads",
    "reference_outputs",
    "run_plan",
    "run_probes",
    "same_bits",
    "tokenwise_plan",
    "upcast64",
    "variants_of",
    "with_grad_mode_check",
]
