"""The agent: proposers and the search loop over the optimization IR (never imports textual)."""

from __future__ import annotations

import os
from typing import Any

from tik_tui.agent.base import (
    BudgetExhausted,
    NothingToPropose,
    Proposal,
    ProposalContext,
    ProposalFailed,
    ProposerFatal,
)

__all__ = ["BudgetExhausted", "NothingToPropose", "Proposal", "ProposalContext", "ProposalFailed", "ProposerFatal",
           "default_proposer", "make_proposer"]


def default_proposer() -> str:
    """`claude` when an API key is set, else the offline `tuner`."""
    return "claude" if os.environ.get("ANTHROPIC_API_KEY") else "tuner"


def make_proposer(spec: str, **opts: Any) -> Any:
    """A proposer from its name: "tuner", "claude" or "replay:FILE". Unknown options for it are ignored."""
    if spec == "tuner":
        from tik_tui.agent.tuner import TunerProposer

        return TunerProposer(seed=int(opts.get("seed", 0)))
    if spec == "claude":
        from tik_tui.agent.claude import ClaudeProposer

        keep = {"model", "api_key", "client", "max_tokens", "max_turns", "retries", "stream", "sleep", "backoff_s",
                "thinking", "effort", "record"}
        p = ClaudeProposer(**{k: v for k, v in opts.items() if k in keep and v is not None})
        p.supports_merge = True
        return p
    if spec.startswith("replay:"):
        from tik_tui.agent.replay import ReplayProposer

        p = ReplayProposer(spec.split(":", 1)[1])
        p.label = spec.split(":", 1)[0] + ":" + p.tag
        return p
    raise ProposerFatal(f"unknown proposer {spec!r} (use claude, tuner or replay:FILE)")
