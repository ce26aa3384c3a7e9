"""The search: select → propose → record → evaluate → decide, until something says stop.

This module only orchestrates; each phase is its own module, and a derivation's data flows
one way through them:

    select.choose      parent (+ merge partner)          -> Selection
    propose            the context the proposer sees     -> ProposalContext -> proposer -> Proposal
    record             the proposal as a derivation      -> impl id (a `candidate` in the IR)
    evaluate           the job on the executor           -> Outcome (retried when its process died)
    decide             the outcome into the IR           -> status (eligible: queued or auto-promoted)

beside them `budget` (what is spent, when to stop), `control` (events, heartbeat, commands) and
`state` (the config and the tallies).

Everything durable goes through the store as it happens, so the loop can be killed at any
point and resumed: a derivation is recorded (as a `candidate`, tagged with the search id)
before it is evaluated, and a restarted search first evaluates the candidates it finds.
Budget spent is counted from the store (derivations tagged with this search), so a kill
neither loses nor repeats an evaluation's worth of budget.

Stops: evaluation budget, tokens, dollars, wall time, patience (that many derivations in a
row with no eligible or promoted one), a `stop` command, a proposer that cannot go on (a
rejected key at once; `max_failures` failed proposals in a row; an unrecorded failure such as
an unreachable API before any proposal succeeded), or every parent exhausted. `pause` /
`resume` commands are honoured between steps.

Several candidates can be in flight: the loop proposes while the executor has a free slot
(`tik_tui.agent.executor`), and records each outcome, in this process only, when it comes
back. A proposal sees every outcome recorded before it, so with one slot the search is
exactly sequential; with more, which outcomes a proposal has seen depends on timing (the
derivations are the same whenever proposals do not depend on results in flight, e.g. the
tuner with `explore=False`). A job whose process dies is retried once, then failed with the
reason. Stopping (budget, command, SIGTERM) finishes what is in flight before it returns.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from typing import Any

from tik_tui.agent import budget
from tik_tui.agent.base import BudgetExhausted, NothingToPropose, ProposalFailed, ProposerFatal
from tik_tui.agent.control import Control
from tik_tui.agent.decide import Decider
from tik_tui.agent.evaluate import Evaluations
from tik_tui.agent.executor import InlineExecutor
from tik_tui.agent.propose import ContextBuilder
from tik_tui.agent.record import Recorder
from tik_tui.agent.select import choose
from tik_tui.agent.state import SearchConfig, SearchState

__all__ = ["Search", "SearchConfig", "SearchState"]


class Search:
    """One search over `cfg.ops` with one proposer. `run()` returns a summary dict."""

    def __init__(self, ws: Any, proposer: Any, cfg: SearchConfig, *, evaluate: Callable | None = None,
                 search_id: str | None = None, on_event: Callable[[str, dict], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, executor: Any | None = None,
                 screen: Callable | None = None):
        self.ws = ws
        self.proposer = proposer
        self.cfg = cfg
        #: where evaluations run (`tik_tui.agent.executor`); the caller closes one it passes in
        self.executor = executor if executor is not None else InlineExecutor(evaluate, cfg.device)
        model = getattr(proposer, "model", None)
        if cfg.max_cost_usd is not None and model is not None:
            from tik_tui.agent.pricing import check_max_cost

            check_max_cost(model)
        self.rng = random.Random(cfg.seed)
        self.state = SearchState(search_id or hashlib.sha1(f"{time.time()}{id(self)}".encode()).hexdigest()[:12],
                                 time.time())
        self.exhausted: dict[str, set[int]] = {op: set() for op in cfg.ops}
        self.proposer_name: str = getattr(proposer, "label", None) or proposer.name
        self.control = Control(ws, cfg, self.state, on_event=on_event, should_stop=should_stop)
        self.contexts = ContextBuilder(ws, cfg, self.state, self.control, proposer, self.executor, screen)
        self.recorder = Recorder(ws, self.state, self.control, self.proposer_name)
        self.evals = Evaluations(ws, cfg, self.control, self.executor, Decider(ws, cfg, self.state, self.control))

    def emit(self, kind: str, payload: dict, *, op: str | None = None, impl_id: int | None = None) -> None:
        self.control.emit(kind, payload, op=op, impl_id=impl_id)

    # ------------------------------------------------------------------ resuming

    def resume_from_store(self) -> None:
        """Recount this search's spending from the store; evaluate candidates left unevaluated."""
        s = self.state
        mine = []
        for op in self.cfg.ops:
            mine += [r for r in self.ws.implementations(op=op)
                     if self.contexts.modification(r["id"]).get("search") == s.search_id]
        s.spent = len(mine)
        s.made = [r["id"] for r in mine]
        for op in self.cfg.ops:
            for row in self.ws.implementations(op=op, status="candidate"):
                if not self._wait_for_slot():
                    return
                self.emit("resume_evaluate", {"id": row["id"]}, op=op, impl_id=row["id"])
                self.evals.submit(op, row["id"])

    # ------------------------------------------------------------------ waiting

    def _wait_while_paused(self) -> None:
        while self.state.paused and not self.control.stopping():
            # outcomes of evaluations in flight are still recorded while paused
            if not self.evals.collect(self.cfg.poll_s) and not self.evals.busy():
                time.sleep(self.cfg.poll_s)
            self.control.poll_commands()
            self.control.heartbeat(message="paused")

    def _wait_for_slot(self) -> bool:
        """Block (recording outcomes) until the executor has a free slot; False when stopping."""
        while self.evals.full():
            if self.control.stopping():
                return False
            self.evals.collect(self.cfg.poll_s)
            self.control.poll_commands()
        return not self.control.stopping()

    # ------------------------------------------------------------------ one step

    def step(self, op: str) -> bool:
        """One derivation for `op`, through select → propose → record → evaluate (sent; decided when it comes
        back). False when `op` has nothing left to expand."""
        sel = choose(self.ws, op, self.proposer, explore=self.cfg.explore, exclude=self.exhausted[op], rng=self.rng)
        if sel is None:
            return False
        parent = sel.parent
        self.emit("selected", {"parent": parent["id"], "merge_with": sel.merge_with and sel.merge_with["id"],
                               "reason": sel.reason}, op=op, impl_id=parent["id"])
        ctx = self.contexts.build(op, parent, sel.merge_with)
        try:
            proposal = self.proposer.propose(ctx)
        except NothingToPropose as e:
            if e.everywhere:
                self.state.stop_reason = str(e)
            self.exhausted[op].add(parent["id"])
            self.emit("exhausted", {"parent": parent["id"], "reason": str(e)}, op=op, impl_id=parent["id"])
            return True
        except ProposalFailed as e:
            budget.proposal_failed(self.cfg, self.state, e)
            self.recorder.failed(op, parent, e)
            return True
        budget.proposal_made(self.state)
        impl_id = self.recorder.proposal(op, parent, proposal)
        if impl_id is not None:
            self.evals.submit(op, impl_id)
            self.control.heartbeat(op=op, message=self.evals.message())
        return True

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict:
        s = self.state
        self.control.heartbeat(op=",".join(self.cfg.ops), proposer=self.proposer_name, message="starting")
        self.emit("search_started", {"ops": self.cfg.ops, "proposer": self.proposer_name, "budget": self.cfg.budget,
                                     "auto_promote": self.cfg.auto_promote, "evidence": self.cfg.evidence,
                                     "explore": self.cfg.explore})
        final_state = "finished"
        try:
            self.resume_from_store()
            live = list(self.cfg.ops)
            i = 0
            while live:
                self.control.poll_commands()
                self._wait_while_paused()
                self.evals.collect(0)
                if self.control.stopping():
                    break
                reason = budget.budget_reason(self.cfg, s)
                if reason:
                    s.stop_reason = reason
                    break
                if self.evals.full():
                    self.evals.collect(self.cfg.poll_s)
                    continue
                op = live[i % len(live)]
                self.control.heartbeat(op=op, message=f"step {s.spent + 1}")
                try:
                    progressed = self.step(op)
                except BudgetExhausted as e:
                    budget.account(s, getattr(e, "usage", None))
                    self.recorder.usage_without_impl(getattr(e, "usage", None))
                    s.stop_reason = str(e)
                    break
                if not progressed:
                    if self.evals.busy(op):
                        # its frontier may still grow from what is in flight
                        self.evals.collect(self.cfg.poll_s)
                        i += 1
                        continue
                    live.remove(op)
                    continue
                if s.stop_reason:  # the proposer has nothing more, anywhere
                    break
                i += 1
            self.evals.drain()
            if not live and s.stop_reason is None:
                s.stop_reason = "every parent exhausted"
            if s.stop_reason == "stop command" or (s.stop_reason or "").startswith("terminated"):
                final_state = "stopped"
        except ProposerFatal as e:
            self.evals.drain()
            s.stop_reason = f"error: {e}"
            final_state = "stopped"
        finally:
            if self.executor is not None and isinstance(self.executor, InlineExecutor):
                self.executor.close()
        summary = self.summary()
        self.emit("search_finished", summary)
        self.control.heartbeat(message=s.stop_reason or "done")
        self.ws.set_worker_state(state=final_state, heartbeat=time.time(), message=s.stop_reason or "done")
        summary["state"] = final_state
        return summary

    def summary(self) -> dict:
        s = self.state
        return {"search": s.search_id, "ops": self.cfg.ops, "proposer": self.proposer_name, "spent": s.spent,
                "budget": self.cfg.budget, "tokens": s.tokens,
                "cost_usd": None if s.cost_unknown else round(s.cost_usd, 6),
                "derivations": list(s.made), "stop_reason": s.stop_reason,
                "elapsed_s": round(time.time() - s.started, 2)}
