"""A proposal into the IR: a derivation row and its git commit, before anything evaluates it.

Recorded as `candidate` (tagged with the search id, so a restarted search finds it), or at once
as `failed` when the proposal itself failed. A proposal whose source is already in the IR is
not recorded (nothing new to learn, no duplicate node) but still counts against the budget, so
a proposer that repeats itself cannot loop forever. LLM use that produced no derivation is
recorded unattached, so every dollar spent is in the IR.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tik_tui.agent.base import Proposal, ProposalFailed
from tik_tui.agent.budget import account, store_usage
from tik_tui.agent.control import Control
from tik_tui.agent.state import SearchState


class Recorder:
    def __init__(self, ws: Any, state: SearchState, control: Control, proposer_name: str):
        self.ws, self.state, self.control = ws, state, control
        self.proposer_name = proposer_name

    def record(self, op: str, parents: tuple[int, ...], proposal: Proposal, status: str = "candidate",
               detail: str | None = None) -> int:
        """One derivation row + commit; counts against the budget and the token/dollar tally."""
        mod = {**proposal.modification, "search": self.state.search_id}
        usage = proposal.usage
        impl_id = self.ws.add_implementation(op, proposal.source, parents=parents, proposer=self.proposer_name,
                                             rationale=proposal.rationale, modification=mod,
                                             usage=store_usage(usage), status=status)
        if status != "candidate" and detail:
            self.ws.set_status(impl_id, status, detail=detail)
        self.state.spent += 1
        self.state.made.append(impl_id)
        account(self.state, usage)
        return impl_id

    def usage_without_impl(self, usage: dict | None) -> None:
        """LLM calls that produced no derivation still cost: record them unattached."""
        u = store_usage(usage)
        if u:
            self.ws.record_llm_usage(None, **u)

    def failed(self, op: str, parent: dict, e: ProposalFailed) -> None:
        """A failed proposal: a `failed` derivation (its partial source as negative evidence), or, for one that
        asks not to be recorded (a transient outage), only its usage and an event."""
        if not e.record:
            account(self.state, e.usage)
            self.usage_without_impl(e.usage)
            self.control.emit("proposal_error", {"parent": parent["id"], "reason": str(e)}, op=op)
            return
        failed = Proposal(source=e.source if isinstance(e.source, str) else "", rationale=e.rationale,
                          modification={**e.modification, "error": str(e)}, usage=e.usage)
        impl_id = self.record(op, (parent["id"],), failed, status="failed", detail=f"proposal failed: {e}")
        self.control.emit("proposal_failed", {"id": impl_id, "parent": parent["id"], "reason": str(e)}, op=op,
                          impl_id=impl_id)

    def proposal(self, op: str, parent: dict, proposal: Proposal) -> int | None:
        """A candidate derivation from `parent` (and a merge's extra parents); None for a duplicate source."""
        parents = (parent["id"],)
        parents = parents + tuple(p for p in proposal.extra_parents if p not in parents)
        sha = hashlib.sha256(proposal.source.encode()).hexdigest()
        dup = [r["id"] for r in self.ws.implementations(op=op) if r.get("source_sha256") == sha]
        if dup:
            account(self.state, proposal.usage)
            self.state.spent += 1
            self.state.since_progress += 1
            self.control.emit("duplicate", {"parent": parent["id"], "of": dup[0]}, op=op, impl_id=dup[0])
            self.usage_without_impl(proposal.usage)
            return None
        impl_id = self.record(op, parents, proposal)
        self.control.emit("proposed", {"id": impl_id, "parents": list(parents),
                                       "rationale": proposal.rationale[:500], "usage": proposal.usage},
                          op=op, impl_id=impl_id)
        return impl_id
