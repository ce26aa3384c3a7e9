"""An evaluation's outcome into the IR: the derivation's status, and what the search does next.

The evaluator's report says verified and eligible (the store sets the status from it when it
records the report); here an eligible candidate is promoted at once with auto-promote, else
queued for `tik approve`. A job that failed (evaluator error, process lost too often)
fails its derivation with the reason. Progress (an eligible or promoted derivation) resets
patience.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tik_tui.agent.control import Control
from tik_tui.agent.jobs import Outcome
from tik_tui.agent.state import SearchConfig, SearchState

if TYPE_CHECKING:
    from tik_tui.agent.evaluate import Pending


class Decider:
    def __init__(self, ws: Any, cfg: SearchConfig, state: SearchState, control: Control):
        self.ws, self.cfg, self.state, self.control = ws, cfg, state, control

    def _fail(self, p: Pending, detail: str, extra: dict) -> str:
        self.ws.set_status(p.impl_id, "failed", detail=detail[:500])
        self.control.emit("evaluated", {"id": p.impl_id, "status": "failed", "failure": detail, **extra}, op=p.op,
                          impl_id=p.impl_id)
        self.state.since_progress += 1
        return "failed"

    def __call__(self, p: Pending, out: Outcome) -> str:
        """Record one final outcome; the derivation's status."""
        ws, op, impl_id = self.ws, p.op, p.impl_id
        where = {"worker": out.worker, "attempt": p.attempt}
        if out.lost is not None:
            return self._fail(p, f"evaluation lost {p.attempt} times: {out.lost}", where)
        if out.error is not None:
            return self._fail(p, f"evaluator error: {out.error}", {"trace": out.trace, **where})
        report = out.report or {}
        ws.record_evaluation(impl_id, report)
        status = ws.implementation(impl_id)["status"]
        self.control.emit("evaluated", {"id": impl_id, "status": status, "verified": report.get("verified"),
                                        "failure": report.get("failure"), "objective": report.get("objective"),
                                        "incumbent_objective": report.get("incumbent_objective"),
                                        "eligible": report.get("eligible"), **where}, op=op, impl_id=impl_id)
        if status == "eligible":
            self.state.since_progress = 0
            if self.cfg.auto_promote:
                ws.decide(impl_id, "promote", by="auto-promote", reason="eligible: beats the incumbent in the same run")
                status = "promoted"
                self.control.emit("decided", {"id": impl_id, "action": "promote", "by": "auto-promote"}, op=op,
                                  impl_id=impl_id)
            else:
                self.control.emit("queued", {"id": impl_id}, op=op, impl_id=impl_id)
        else:
            self.state.since_progress += 1
        return status
