"""The search: select → propose → record → evaluate → decide, until something says stop.

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
import json
import random
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from tik_tui.agent.base import (
    BudgetExhausted,
    NothingToPropose,
    Proposal,
    ProposalContext,
    ProposalFailed,
    ProposerFatal,
    config_key,
    module_literal,
)
from tik_tui.agent.executor import InlineExecutor
from tik_tui.agent.jobs import ATTEMPTS, EvalJob, Outcome
from tik_tui.agent.select import select_parent


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


def _mod(row: dict) -> dict:
    mod = row.get("modification")
    if isinstance(mod, str):
        try:
            mod = json.loads(mod)
        except json.JSONDecodeError:
            return {}
    return mod if isinstance(mod, dict) else {}


@dataclass
class Pending:
    """An evaluation in flight: which derivation, which attempt, and the incumbent it is timed against."""

    op: str
    impl_id: int
    attempt: int
    incumbent_id: int | None
    submitted: float


def _usage_tokens(u: dict | None) -> int:
    if not u:
        return 0
    return sum(int(u.get(k) or 0) for k in ("input_tokens", "output_tokens", "cache_read_tokens",
                                            "cache_write_tokens"))


def store_usage(u: dict | None) -> dict | None:
    """The usage fields the store records (drops bookkeeping such as the call count)."""
    if not u:
        return None
    out = {k: int(u.get(k) or 0) for k in ("input_tokens", "output_tokens", "cache_read_tokens",
                                            "cache_write_tokens")}
    return {"model": str(u.get("model") or "?"), "cost_usd": float(u.get("cost_usd") or 0.0), **out}


class Search:
    """One search over `cfg.ops` with one proposer. `run()` returns a summary dict."""

    def __init__(self, ws: Any, proposer: Any, cfg: SearchConfig, *, evaluate: Callable | None = None,
                 search_id: str | None = None, on_event: Callable[[str, dict], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, executor: Any | None = None,
                 screen: Callable | None = None):
        self.ws = ws
        #: screen(op, parent_source, sources, rounds) -> screen result; default tik_kernels.evaluator.screen
        self._screen = screen
        self._warmed: set[str] = set()
        self.proposer = proposer
        self.cfg = cfg
        self._evaluate = evaluate
        #: where evaluations run (`tik_tui.agent.executor`); the caller closes one it passes in
        self.executor = executor if executor is not None else InlineExecutor(evaluate)
        self.inflight: dict[Future, Pending] = {}
        self.on_event = on_event
        self.should_stop = should_stop or (lambda: False)
        model = getattr(proposer, "model", None)
        if cfg.max_cost_usd is not None and model is not None:
            from tik_tui.agent.pricing import check_max_cost

            check_max_cost(model)
        self.rng = random.Random(cfg.seed)
        self.state = SearchState(search_id or hashlib.sha1(f"{time.time()}{id(self)}".encode()).hexdigest()[:12],
                                 time.time())
        self.exhausted: dict[str, set[int]] = {op: set() for op in cfg.ops}
        self._mods: dict[int, dict] = {}
        self._evidence: dict[str, Any] = {}

    # ------------------------------------------------------------------ plumbing

    def emit(self, kind: str, payload: dict, *, op: str | None = None, impl_id: int | None = None) -> None:
        payload = {"search": self.state.search_id, **payload}
        self.ws.append_event(kind, payload, op=op, impl_id=impl_id)
        if self.on_event is not None:
            self.on_event(kind, {**payload, "op": op, "impl_id": impl_id})

    def evaluate_fn(self) -> Callable:
        if self._evaluate is None:
            from tik_kernels.evaluator import evaluate

            self._evaluate = evaluate
        return self._evaluate

    def screener(self, op: str, parent: dict) -> Callable[[list[str], int], dict] | None:
        """The context's `screen` for `parent`, or None where the search does not screen."""
        c = self.cfg
        if c.screen < 2 or self.executor.slots != 1:
            return None
        device = getattr(self.executor, "device", None) or c.device
        if self._screen is None:
            import torch

            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            if not (c.time_it if c.time_it is not None else device.startswith("cuda")):
                return None
        source = self.ws.source(parent["id"])

        def run(sources: list[str], rounds: int) -> dict:
            self.heartbeat(op=op, message=f"screening {len(sources)} variant(s) of #{parent['id']}, {rounds} rounds")
            if self._screen is not None:
                return self._screen(op, source, sources, rounds)
            return self._screen_on_device(op, source, sources, rounds, device)

        return run

    def _screen_on_device(self, op: str, source: str, sources: list[str], rounds: int, device: str) -> dict:
        import tempfile
        from pathlib import Path

        from tik_kernels.evaluator.core import warm_root
        from tik_kernels.evaluator.screen import screen

        root = self.ws.root(op)
        if device.startswith("cuda") and op not in self._warmed and root is not None:
            # the root's probes (which the first evaluation needs anyway) compile the kernels the screen's copy
            # of the cache then starts from
            self._warmed.add(op)
            with tempfile.TemporaryDirectory(prefix="tik-root-") as d:
                path = Path(d) / f"{op}_root.py"
                path.write_text(self.ws.source(root["id"]))
                try:
                    warm_root(op, device=device, timeout=self.cfg.timeout, root_path=path)
                except Exception as e:  # the evaluation reports a broken root; the screen goes on
                    self.emit("warm_root_failed", {"reason": str(e)[:300]}, op=op)
        return screen(op, source, sources, device=device, rounds=rounds, timeout=self.cfg.timeout)

    def modification(self, impl_id: int) -> dict:
        """An implementation's modification record (immutable, so cached)."""
        if impl_id not in self._mods:
            self._mods[impl_id] = _mod(self.ws.implementation(impl_id))
        return self._mods[impl_id]

    def _contract(self, op: str) -> dict:
        for row in self.ws.operators():
            if row.get("op") == op:
                c = row.get("contract")
                return json.loads(c) if isinstance(c, str) else dict(c or {})
        return {}

    def heartbeat(self, **fields) -> None:
        s = self.state
        self.ws.set_worker_state(
            state="paused" if s.paused else "running", heartbeat=time.time(), spent=s.spent,
            budget=self.cfg.budget, search=s.search_id, tokens=s.tokens,
            cost_usd=None if s.cost_unknown else round(s.cost_usd, 6),
            started=s.started, **fields)

    # ------------------------------------------------------------------ resuming

    def resume_from_store(self) -> None:
        """Recount this search's spending from the store; evaluate candidates left unevaluated."""
        s = self.state
        mine = []
        for op in self.cfg.ops:
            mine += [r for r in self.ws.implementations(op=op)
                     if self.modification(r["id"]).get("search") == s.search_id]
        s.spent = len(mine)
        s.made = [r["id"] for r in mine]
        for op in self.cfg.ops:
            for row in self.ws.implementations(op=op, status="candidate"):
                if not self._wait_for_slot():
                    return
                self.emit("resume_evaluate", {"id": row["id"]}, op=op, impl_id=row["id"])
                self.submit(op, row["id"])

    # ------------------------------------------------------------------ control

    def poll_commands(self) -> None:
        s = self.state
        for cmd in self.ws.take_commands():
            kind = cmd.get("kind")
            if kind == "pause" and not s.paused:
                s.paused = True
                self.emit("paused", {})
                self.heartbeat(message="paused")
            elif kind == "resume" and s.paused:
                s.paused = False
                self.emit("resumed", {})
                self.heartbeat(message="running")
            elif kind == "stop":
                s.stop_reason = "stop command"

    def _stopping(self) -> bool:
        if self.should_stop():
            self.state.stop_reason = self.state.stop_reason or "terminated (SIGTERM)"
        return self.state.stop_reason is not None

    def _wait_while_paused(self) -> None:
        while self.state.paused and not self._stopping():
            # outcomes of evaluations in flight are still recorded while paused
            if not self.collect(self.cfg.poll_s) and not self.inflight:
                time.sleep(self.cfg.poll_s)
            self.poll_commands()
            self.heartbeat(message="paused")

    def _wait_for_slot(self) -> bool:
        """Block (recording outcomes) until the executor has a free slot; False when stopping."""
        while len(self.inflight) >= self.executor.slots:
            if self._stopping():
                return False
            self.collect(self.cfg.poll_s)
            self.poll_commands()
        return not self._stopping()

    def budget_reason(self) -> str | None:
        s, c = self.state, self.cfg
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

    # ------------------------------------------------------------------ one step

    def build_context(self, op: str, parent: dict, merge_with: dict | None) -> ProposalContext:
        ws, c = self.ws, self.cfg
        tried = set()
        for row in ws.implementations(op=op):
            cfg = self.modification(row["id"]).get("config")
            if not isinstance(cfg, dict):
                cfg = module_literal(ws.source(row["id"]), "CONFIG")
            if isinstance(cfg, dict):
                tried.add(config_key(cfg))
        s = self.state
        return ProposalContext(
            op=op, parent=parent, parent_source=ws.source(parent["id"]), contract=self._contract(op),
            measurements=ws.measurements(parent["id"]),
            attempts=ws.attempts(op, parent=parent["id"]) if c.evidence else [],
            opportunities=ws.opportunities(op) if c.evidence else [],
            frontier=ws.frontier(op), root=ws.root(op), incumbent=ws.incumbent(op),
            merge_with=merge_with, merge_source=ws.source(merge_with["id"]) if merge_with else None,
            tried_configs=tried, store=ws,
            emit=lambda kind, payload: self.emit(kind, payload, op=op, impl_id=parent["id"]),
            tokens_left=None if c.max_tokens is None else c.max_tokens - s.tokens,
            dollars_left=None if c.max_cost_usd is None else c.max_cost_usd - s.cost_usd,
            evidence=c.evidence, seed=c.seed + s.spent,
            screen=self.screener(op, parent), screen_width=c.screen,
            device_evidence=self.device_evidence(op) if getattr(self.proposer, "wants_device_evidence", False)
            else None,
        )

    def device_evidence(self, op: str) -> Any:
        """The operator's `DeviceEvidence` on the search's device (one per search, so its cache lives on)."""
        if op not in self._evidence:
            from tik_tui.agent.evidence import DeviceEvidence

            device = getattr(self.executor, "device", None) or self.cfg.device
            if device is None:
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
            self._evidence[op] = DeviceEvidence(self.ws, op, device, timeout=max(self.cfg.timeout, 300.0),
                                                exclusive=self.executor.slots == 1)
        return self._evidence[op]

    def _choose(self, op: str) -> tuple[dict, dict | None, str] | None:
        ws = self.ws
        pref = getattr(self.proposer, "preferred_parent", None)
        if pref is not None:
            pid, mid = pref(op, ws)
            if pid is not None:
                return ws.implementation(pid), ws.implementation(mid) if mid is not None else None, "requested"
        sel = select_parent(ws, op, explore=self.cfg.explore, exclude=self.exhausted[op],
                            can_merge=bool(getattr(self.proposer, "supports_merge", False)), rng=self.rng)
        if sel is None:
            return None
        return sel.parent, sel.merge_with, sel.reason

    def _account(self, usage: dict | None) -> None:
        if usage:
            self.state.tokens += _usage_tokens(usage)
            if usage.get("cost_usd") is None and _usage_tokens(usage):
                self.state.cost_unknown = True
            self.state.cost_usd += float(usage.get("cost_usd") or 0.0)

    def _record(self, op: str, parents: tuple[int, ...], proposal: Proposal, status: str = "candidate",
                detail: str | None = None) -> int:
        mod = {**proposal.modification, "search": self.state.search_id}
        usage = proposal.usage
        impl_id = self.ws.add_implementation(op, proposal.source, parents=parents, proposer=self.proposer_name,
                                             rationale=proposal.rationale, modification=mod,
                                             usage=store_usage(usage), status=status)
        if status != "candidate" and detail:
            self.ws.set_status(impl_id, status, detail=detail)
        self.state.spent += 1
        self.state.made.append(impl_id)
        self._account(usage)
        return impl_id

    def _usage_without_impl(self, usage: dict | None) -> None:
        """LLM calls that produced no derivation still cost: record them unattached."""
        u = store_usage(usage)
        if u:
            self.ws.record_llm_usage(None, **u)

    @property
    def proposer_name(self) -> str:
        return getattr(self.proposer, "label", None) or self.proposer.name

    def step(self, op: str) -> bool:
        """One derivation for `op`. False when `op` has nothing left to expand."""
        chosen = self._choose(op)
        if chosen is None:
            return False
        parent, merge_with, reason = chosen
        self.emit("selected", {"parent": parent["id"], "merge_with": merge_with and merge_with["id"],
                               "reason": reason}, op=op, impl_id=parent["id"])
        ctx = self.build_context(op, parent, merge_with)
        parents = (parent["id"],)
        try:
            proposal = self.proposer.propose(ctx)
        except NothingToPropose as e:
            if e.everywhere:
                self.state.stop_reason = str(e)
            self.exhausted[op].add(parent["id"])
            self.emit("exhausted", {"parent": parent["id"], "reason": str(e)}, op=op, impl_id=parent["id"])
            return True
        except ProposalFailed as e:
            s = self.state
            s.since_progress += 1
            s.failures += 1
            if s.failures >= self.cfg.max_failures:
                s.stop_reason = f"{s.failures} proposals in a row failed (last: {e})"
            elif not e.record and not s.proposed:
                # an API that stays unreachable or refuses from the first call: retrying the next parent
                # would spend the same minutes again with nothing to show
                s.stop_reason = f"the proposer failed before any proposal: {e}"
            if not e.record:
                self._account(e.usage)
                self._usage_without_impl(e.usage)
                self.emit("proposal_error", {"parent": parent["id"], "reason": str(e)}, op=op)
                return True
            failed = Proposal(source=e.source if isinstance(e.source, str) else "", rationale=e.rationale,
                              modification={**e.modification, "error": str(e)}, usage=e.usage)
            impl_id = self._record(op, parents, failed, status="failed", detail=f"proposal failed: {e}")
            self.emit("proposal_failed", {"id": impl_id, "parent": parent["id"], "reason": str(e)}, op=op,
                      impl_id=impl_id)
            return True
        self.state.failures = 0
        self.state.proposed += 1
        parents = parents + tuple(p for p in proposal.extra_parents if p not in parents)
        sha = hashlib.sha256(proposal.source.encode()).hexdigest()
        dup = [r["id"] for r in self.ws.implementations(op=op) if r.get("source_sha256") == sha]
        if dup:
            # identical source: nothing new to learn, and no duplicate node in the IR
            self._account(proposal.usage)
            # it still counts against the budget, so a proposer that repeats itself cannot loop forever
            self.state.spent += 1
            self.state.since_progress += 1
            self.emit("duplicate", {"parent": parent["id"], "of": dup[0]}, op=op, impl_id=dup[0])
            self._usage_without_impl(proposal.usage)
            return True
        impl_id = self._record(op, parents, proposal)
        self.emit("proposed", {"id": impl_id, "parents": list(parents), "rationale": proposal.rationale[:500],
                               "usage": proposal.usage}, op=op, impl_id=impl_id)
        self.submit(op, impl_id)
        self.heartbeat(op=op, message=self._evaluating_message())
        return True

    # ------------------------------------------------------------------ evaluations

    def submit(self, op: str, impl_id: int, attempt: int = 1) -> Future:
        """Send one derivation's evaluation to the executor, timed against today's root and incumbent."""
        ws = self.ws
        root = ws.root(op)
        inc = ws.incumbent(op) or root
        job = EvalJob(op=op, impl_id=impl_id, source=ws.source(impl_id),
                      root_id=root["id"] if root else None, root_source=ws.source(root["id"]) if root else None,
                      incumbent_id=inc["id"] if inc else None,
                      incumbent_source=ws.source(inc["id"]) if inc else None,
                      device=getattr(self.executor, "device", None) or self.cfg.device, timeout=self.cfg.timeout,
                      time_it=self.cfg.time_it)
        self.emit("evaluating", {"id": impl_id, **({"attempt": attempt} if attempt > 1 else {})}, op=op,
                  impl_id=impl_id)
        fut = self.executor.submit(job)
        self.inflight[fut] = Pending(op, impl_id, attempt, job.incumbent_id, time.time())
        return fut

    def collect(self, timeout: float | None = 0.0) -> int:
        """Record the outcomes that are back (waiting up to `timeout` for the first); how many came back."""
        if not self.inflight:
            return 0
        done, _ = wait_futures(list(self.inflight), timeout=timeout, return_when=FIRST_COMPLETED)
        # outcomes that arrive together are recorded in derivation order
        for fut in sorted(done, key=lambda f: self.inflight[f].impl_id):
            self.complete(self.inflight.pop(fut), fut.result())
        return len(done)

    def drain(self) -> None:
        """Wait for everything in flight and record it."""
        while self.inflight:
            self.heartbeat(message=f"finishing {len(self.inflight)} evaluation(s) in flight")
            self.collect(self.cfg.poll_s)

    def _evaluating_message(self) -> str:
        ids = sorted(p.impl_id for p in self.inflight.values())
        return "evaluating " + ", ".join(f"#{i}" for i in ids) if ids else "running"

    def _fail(self, p: Pending, detail: str, extra: dict) -> str:
        self.ws.set_status(p.impl_id, "failed", detail=detail[:500])
        self.emit("evaluated", {"id": p.impl_id, "status": "failed", "failure": detail, **extra}, op=p.op,
                  impl_id=p.impl_id)
        self.state.since_progress += 1
        return "failed"

    def complete(self, p: Pending, out: Outcome) -> str | None:
        """Record one outcome; None when the evaluation was sent again (a lost worker, a new incumbent)."""
        ws, op, impl_id = self.ws, p.op, p.impl_id
        where = {"worker": out.worker, "attempt": p.attempt}
        if out.lost is not None:
            if p.attempt < ATTEMPTS:
                self.emit("eval_retry", {"id": impl_id, "reason": out.lost, **where}, op=op, impl_id=impl_id)
                self.submit(op, impl_id, p.attempt + 1)
                return None
            return self._fail(p, f"evaluation lost {p.attempt} times: {out.lost}", where)
        if out.error is not None:
            return self._fail(p, f"evaluator error: {out.error}", {"trace": out.trace, **where})
        report = out.report or {}
        inc = ws.incumbent(op) or ws.root(op)
        if self.cfg.auto_promote and report.get("eligible") and inc and inc["id"] != p.incumbent_id:
            # promoted meanwhile: "beats the incumbent" must be measured against the one promotion would replace
            self.emit("retime", {"id": impl_id, "was": p.incumbent_id, "incumbent": inc["id"]}, op=op,
                      impl_id=impl_id)
            self.submit(op, impl_id, p.attempt)
            return None
        ws.record_evaluation(impl_id, report)
        status = ws.implementation(impl_id)["status"]
        self.emit("evaluated", {"id": impl_id, "status": status, "verified": report.get("verified"),
                                "failure": report.get("failure"), "objective": report.get("objective"),
                                "incumbent_objective": report.get("incumbent_objective"),
                                "eligible": report.get("eligible"), **where}, op=op, impl_id=impl_id)
        if status == "eligible":
            self.state.since_progress = 0
            if self.cfg.auto_promote:
                ws.decide(impl_id, "promote", by="auto-promote", reason="eligible: beats the incumbent in the same run")
                status = "promoted"
                self.emit("decided", {"id": impl_id, "action": "promote", "by": "auto-promote"}, op=op,
                          impl_id=impl_id)
            else:
                self.emit("queued", {"id": impl_id}, op=op, impl_id=impl_id)
        else:
            self.state.since_progress += 1
        return status

    def evaluate_and_decide(self, op: str, impl_id: int) -> str:
        """Evaluate one derivation now (retries included) and record it; its final status."""
        self.submit(op, impl_id)
        while any(p.impl_id == impl_id for p in self.inflight.values()):
            self.collect(self.cfg.poll_s)
        return self.ws.implementation(impl_id)["status"]

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict:
        s = self.state
        self.heartbeat(op=",".join(self.cfg.ops), proposer=self.proposer_name, message="starting")
        self.emit("search_started", {"ops": self.cfg.ops, "proposer": self.proposer_name, "budget": self.cfg.budget,
                                     "auto_promote": self.cfg.auto_promote, "evidence": self.cfg.evidence,
                                     "explore": self.cfg.explore})
        final_state = "finished"
        try:
            self.resume_from_store()
            live = list(self.cfg.ops)
            i = 0
            while live:
                self.poll_commands()
                self._wait_while_paused()
                self.collect(0)
                if self._stopping():
                    break
                reason = self.budget_reason()
                if reason:
                    s.stop_reason = reason
                    break
                if len(self.inflight) >= self.executor.slots:
                    self.collect(self.cfg.poll_s)
                    continue
                op = live[i % len(live)]
                self.heartbeat(op=op, message=f"step {s.spent + 1}")
                try:
                    progressed = self.step(op)
                except BudgetExhausted as e:
                    self._account(getattr(e, "usage", None))
                    self._usage_without_impl(getattr(e, "usage", None))
                    s.stop_reason = str(e)
                    break
                if not progressed:
                    if any(p.op == op for p in self.inflight.values()):
                        # its frontier may still grow from what is in flight
                        self.collect(self.cfg.poll_s)
                        i += 1
                        continue
                    live.remove(op)
                    continue
                if s.stop_reason:  # the proposer has nothing more, anywhere
                    break
                i += 1
            self.drain()
            if not live and s.stop_reason is None:
                s.stop_reason = "every parent exhausted"
            if s.stop_reason == "stop command" or (s.stop_reason or "").startswith("terminated"):
                final_state = "stopped"
        except ProposerFatal as e:
            self.drain()
            s.stop_reason = f"error: {e}"
            final_state = "stopped"
        finally:
            if self.executor is not None and isinstance(self.executor, InlineExecutor):
                self.executor.close()
        summary = self.summary()
        self.emit("search_finished", summary)
        self.heartbeat(message=s.stop_reason or "done")
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
