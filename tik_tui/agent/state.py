"""What a search is asked to do (`SearchConfig`) and what it has done so far (`SearchState`).

Plain data: every phase of a step (`select`, `propose`, `record`, `evaluate`, `decide`) reads
them; `budget` says which tallies move and when they stop the search.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SearchConfig:
    ops: list[str]
    #: derivations to make (each recorded proposal counts, failed ones too); None: unbounded
    budget: int | None = 8
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_wall_s: float | None = None
    #: stop after this many derivations in a row without an eligible/promoted one
    patience: int | None = None
    #: stop after this many proposals in a row that failed (malformed output, an API that stays unreachable)
    max_failures: int = 3
    auto_promote: bool = False
    device: str | None = None
    timeout: float = 120.0
    #: ablations: retained evidence in the context; branch exploration (off: greedy from the incumbent)
    evidence: bool = True
    explore: bool = True
    seed: int = 0
    #: passed to the evaluator when set (None: its default, timing only on cuda)
    time_it: bool | None = None
    #: seconds between control polls while paused
    poll_s: float = 0.5
    #: the tuner's screen: moves timed together before one is evaluated (0 or 1: off). Only where the
    #: search times (time_it, default on cuda) and with one evaluation slot, so a screen never shares the
    #: device with an evaluation
    screen: int = 0


@dataclass
class SearchState:
    search_id: str
    started: float
    spent: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    #: some LLM use had no price (a model missing from tik_tui.agent.pricing): cost_usd is a lower bound
    cost_unknown: bool = False
    since_progress: int = 0
    #: proposals in a row that failed, and proposals that succeeded in this search
    failures: int = 0
    proposed: int = 0
    paused: bool = False
    stop_reason: str | None = None
    made: list[int] = field(default_factory=list)
