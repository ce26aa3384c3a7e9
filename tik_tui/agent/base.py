"""What every proposer takes and returns, and the ways a proposal can fail.

A proposer sees a `ProposalContext` (the parent, its evidence, the contract) and returns a
`Proposal`: a complete new implementation file plus why. It never writes to the store
itself, except through the `record_opportunity` hook the context hands it.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Proposal:
    """A new implementation file derived from `ProposalContext.parent`."""

    source: str
    rationale: str = ""
    #: what changed and why: kind (tune|rewrite|merge|replay), mechanism, expected_effect, numerical_risks, ...
    modification: dict = field(default_factory=dict)
    #: model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd (None: no LLM)
    usage: dict | None = None
    #: further parents besides the context's parent (a merge of two verified branches)
    extra_parents: tuple[int, ...] = ()


@dataclass
class ProposalContext:
    """Everything a proposer may know when it writes a candidate (the retained evidence)."""

    op: str
    #: the parent implementation's row (id, status, proposer, ...)
    parent: dict
    parent_source: str
    #: the contract as data (Contract.describe()): entries, requirements, frozen_tunables, ...
    contract: dict = field(default_factory=dict)
    #: the parent's measurements per workload cell (EvalReport cells)
    measurements: list[dict] = field(default_factory=list)
    #: earlier attempts from this parent, failed and rejected ones with their reasons
    attempts: list[dict] = field(default_factory=list)
    #: open opportunities for this operator (mechanism, workloads, evidence)
    opportunities: list[dict] = field(default_factory=list)
    #: verified implementations of this operator, best first
    frontier: list[dict] = field(default_factory=list)
    root: dict | None = None
    incumbent: dict | None = None
    #: for a merge: the second verified branch and its source
    merge_with: dict | None = None
    merge_source: str | None = None
    #: every configuration already tried for this operator (tuner), as sorted item tuples
    tried_configs: set = field(default_factory=set)
    #: the store (read-only use by tools), or None
    store: Any = None
    #: emit(kind, payload): append an event for viewers (partial source while streaming)
    emit: Callable[[str, dict], None] | None = None
    #: tokens / dollars still allowed (None: unbounded)
    tokens_left: int | None = None
    dollars_left: float | None = None
    #: screen(sources, rounds) -> tik_kernels.evaluator.screen result: a quick timing of variants beside the parent
    #: (None: no timed device, or screening off); the tuner screens `screen_width` moves at a time
    screen: Callable[[list[str], int], dict] | None = None
    screen_width: int = 0
    #: device evidence for this operator (`tik_tui.agent.evidence.DeviceEvidence`: compile stats, floor fractions,
    #: a draft's quick timing, an Nsight Compute profile), or None
    device_evidence: Any = None
    #: ablation: False hides attempts and opportunities from the proposer
    evidence: bool = True
    seed: int = 0


class ProposalFailed(Exception):
    """The proposer produced nothing usable this time (malformed output, no submission).

    The loop records a failed derivation (`source` may be partial or the parent's) and goes on.
    With `record=False` (a transient outage) nothing is recorded.
    """

    def __init__(self, message: str, *, source: str | None = None, usage: dict | None = None,
                 rationale: str = "", modification: dict | None = None, record: bool = True):
        super().__init__(message)
        self.source = source
        self.usage = usage
        self.rationale = rationale
        self.modification = modification or {}
        self.record = record


class ProposerFatal(Exception):
    """The proposer cannot work at all (missing or rejected API key, unknown model): stop the search."""


class NothingToPropose(Exception):
    """This parent offers nothing new to this proposer (every allowed config tried, replay exhausted)."""

    def __init__(self, message: str, *, everywhere: bool = False):
        super().__init__(message)
        #: True when no parent will ever do (the replay file is used up)
        self.everywhere = everywhere


class BudgetExhausted(Exception):
    """A token or dollar budget would be exceeded by another call."""


def modification_of(row: dict) -> dict:
    """An implementation row's modification record as a dict ({} when absent or not valid JSON)."""
    mod = row.get("modification")
    if isinstance(mod, str):
        try:
            mod = json.loads(mod)
        except json.JSONDecodeError:
            return {}
    return mod if isinstance(mod, dict) else {}


def module_literal(source: str, name: str) -> Any:
    """The value of a module-level `NAME = <literal>` assignment, or None when absent or not literal (a fresh copy:
    the caller may change it)."""
    value = _module_literals(source).get(name)
    if isinstance(value, _Unevaluable):
        raise value.error  # as ast.literal_eval raised it (what it raises but ValueError is the caller's to see)
    return copy.deepcopy(value)


@dataclass(frozen=True)
class _Unevaluable:
    error: BaseException


@functools.lru_cache(maxsize=16)
def _module_literals(source: str) -> dict[str, Any]:
    """Every module-level `NAME = ...` of a source: its literal value, or None where it is not a literal; the first
    assignment of a name counts. Parsed once per source text: a tuner proposal reads CONFIG, TUNABLES and others
    from the same parent source (linear's root: 5 ms a parse, 120 parses in a 24-evaluation search)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id not in out:
                    try:
                        out[t.id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[t.id] = None
                    except Exception as e:  # noqa: BLE001 - kept, raised to whoever asks for this name
                        out[t.id] = _Unevaluable(e)
    return out


def config_key(config: dict) -> tuple:
    """A hashable, order-free form of a CONFIG dict."""
    return tuple(sorted((str(k), repr(v)) for k, v in config.items()))


def check_source(source: Any, entries: tuple[str, ...] | list[str] = ()) -> str:
    """Validate a submitted implementation file; returns it or raises ProposalFailed with the cause."""
    if not isinstance(source, str) or not source.strip():
        raise ProposalFailed("submitted source is missing or not a string")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ProposalFailed(f"submitted source does not parse: line {e.lineno}: {e.msg}", source=source) from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [e for e in entries if e not in defined]
    if missing:
        raise ProposalFailed(f"submitted source does not define {', '.join(missing)}", source=source)
    return source
