"""Evaluations in flight: send a recorded candidate to the executor, collect what comes back.

Each job is timed against the root and the incumbent of the moment it is sent. An outcome
goes on to `decide` unless the job has to be sent again: its process died (retried until
`ATTEMPTS`), or, with auto-promote, an eligible candidate was timed against an incumbent that
has since been replaced ("beats the incumbent" must be measured against the one promotion
would replace). Outcomes that arrive together are passed on in derivation order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from tik_tui.agent.control import Control
from tik_tui.agent.jobs import ATTEMPTS, EvalJob, Outcome
from tik_tui.agent.state import SearchConfig


@dataclass
class Pending:
    """An evaluation in flight: which derivation, which attempt, and the incumbent it is timed against."""

    op: str
    impl_id: int
    attempt: int
    incumbent_id: int | None
    submitted: float


class Evaluations:
    def __init__(self, ws: Any, cfg: SearchConfig, control: Control, executor: Any,
                 decide: Callable[[Pending, Outcome], str]):
        self.ws, self.cfg, self.control, self.executor = ws, cfg, control, executor
        #: decide(pending, outcome) -> the derivation's status, for every outcome that is final
        self.decide = decide
        self.inflight: dict[Future, Pending] = {}

    def submit(self, op: str, impl_id: int, attempt: int = 1) -> Future:
        """Send one derivation's evaluation to the executor, timed against today's root and incumbent."""
        ws = self.ws
        root = ws.root(op)
        inc = ws.incumbent(op) or root
        # an incumbent that is the root is not sent: the evaluator then judges against the root, timed once. Sent, it
        # was a third contender running the root's code in every round, warm-up, capture and profile (H200,
        # attention search with the root incumbent: 25.1 s an evaluation, against 16.4 s timed without)
        distinct = inc is not None and (root is None or inc["id"] != root["id"])
        job = EvalJob(op=op, impl_id=impl_id, source=ws.source(impl_id),
                      root_id=root["id"] if root else None, root_source=ws.source(root["id"]) if root else None,
                      incumbent_id=inc["id"] if inc else None,
                      incumbent_source=ws.source(inc["id"]) if distinct else None,
                      device=getattr(self.executor, "device", None) or self.cfg.device, timeout=self.cfg.timeout,
                      time_it=self.cfg.time_it)
        self.control.emit("evaluating", {"id": impl_id, **({"attempt": attempt} if attempt > 1 else {})}, op=op,
                          impl_id=impl_id)
        fut = self.executor.submit(job)
        self.inflight[fut] = Pending(op, impl_id, attempt, job.incumbent_id, time.time())
        return fut

    def collect(self, timeout: float | None = 0.0) -> int:
        """Pass on the outcomes that are back (waiting up to `timeout` for the first); how many came back."""
        if not self.inflight:
            return 0
        done, _ = wait_futures(list(self.inflight), timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in sorted(done, key=lambda f: self.inflight[f].impl_id):
            self.complete(self.inflight.pop(fut), fut.result())
        return len(done)

    def drain(self) -> None:
        """Wait for everything in flight and pass it on."""
        while self.inflight:
            self.control.heartbeat(message=f"finishing {len(self.inflight)} evaluation(s) in flight")
            self.collect(self.cfg.poll_s)

    def busy(self, op: str | None = None) -> bool:
        """Any evaluation (of `op`, when given) in flight."""
        return any(op is None or p.op == op for p in self.inflight.values())

    def full(self) -> bool:
        return len(self.inflight) >= self.executor.slots

    def message(self) -> str:
        ids = sorted(p.impl_id for p in self.inflight.values())
        return "evaluating " + ", ".join(f"#{i}" for i in ids) if ids else "running"

    def complete(self, p: Pending, out: Outcome) -> str | None:
        """Pass one outcome to `decide`; None when the evaluation was sent again (a lost worker, a new incumbent)."""
        op, impl_id = p.op, p.impl_id
        if out.lost is not None and p.attempt < ATTEMPTS:
            self.control.emit("eval_retry", {"id": impl_id, "reason": out.lost, "worker": out.worker,
                                             "attempt": p.attempt}, op=op, impl_id=impl_id)
            self.submit(op, impl_id, p.attempt + 1)
            return None
        if out.lost is None and out.error is None and self.cfg.auto_promote and (out.report or {}).get("eligible"):
            inc = self.ws.incumbent(op) or self.ws.root(op)
            if inc and inc["id"] != p.incumbent_id:
                self.control.emit("retime", {"id": impl_id, "was": p.incumbent_id, "incumbent": inc["id"]}, op=op,
                                  impl_id=impl_id)
                self.submit(op, impl_id, p.attempt)
                return None
        return self.decide(p, out)
