"""What a search has spent, and when its spending or its failures stop it.

Tokens and dollars come from the proposals' usage; derivations are counted where they are
recorded (`record`). Stop rules here: the evaluation, token, dollar and wall-time budgets,
patience, and proposals that keep failing.
"""

from __future__ import annotations

import time

from tik_tui.agent.base import ProposalFailed
from tik_tui.agent.state import SearchConfig, SearchState

_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def usage_tokens(u: dict | None) -> int:
    if not u:
        return 0
    return sum(int(u.get(k) or 0) for k in _TOKEN_FIELDS)


def store_usage(u: dict | None) -> dict | None:
    """The usage fields the store records (drops bookkeeping such as the call count)."""
    if not u:
        return None
    out = {k: int(u.get(k) or 0) for k in _TOKEN_FIELDS}
    return {"model": str(u.get("model") or "?"), "cost_usd": float(u.get("cost_usd") or 0.0), **out}


def account(state: SearchState, usage: dict | None) -> None:
    """Add one proposal's (or failed call's) tokens and dollars to the search's tally."""
    if usage:
        state.tokens += usage_tokens(usage)
        if usage.get("cost_usd") is None and usage_tokens(usage):
            state.cost_unknown = True
        state.cost_usd += float(usage.get("cost_usd") or 0.0)


def budget_reason(cfg: SearchConfig, state: SearchState) -> str | None:
    """Why the search must stop before its next step, or None."""
    s, c = state, cfg
    if c.budget is not None and s.spent >= c.budget:
        return f"budget of {c.budget} derivations spent"
    if c.max_tokens is not None and s.tokens >= c.max_tokens:
        return f"token budget spent ({s.tokens} >= {c.max_tokens})"
    if c.max_cost_usd is not None and s.cost_usd >= c.max_cost_usd:
        return f"dollar budget spent (${s.cost_usd:.4f} >= ${c.max_cost_usd:.4f})"
    if c.max_wall_s is not None and time.time() - s.started >= c.max_wall_s:
        return f"wall time of {c.max_wall_s:g} s spent"
    if c.patience is not None and s.since_progress >= c.patience:
        return f"patience: {s.since_progress} derivations without an eligible one"
    return None


def proposal_failed(cfg: SearchConfig, state: SearchState, e: ProposalFailed) -> None:
    """Count a failed proposal; stop after `max_failures` in a row, or at once when none ever succeeded and
    nothing was recorded (an API that stays unreachable or refuses from the first call: retrying the next
    parent would spend the same minutes again with nothing to show)."""
    s = state
    s.since_progress += 1
    s.failures += 1
    if s.failures >= cfg.max_failures:
        s.stop_reason = f"{s.failures} proposals in a row failed (last: {e})"
    elif not e.record and not s.proposed:
        s.stop_reason = f"the proposer failed before any proposal: {e}"


def proposal_made(state: SearchState) -> None:
    state.failures = 0
    state.proposed += 1
