"""What a proposer is shown: the `ProposalContext` for one parent, read from the IR.

The context carries the parent and its evidence (measurements, earlier attempts, open
opportunities, configurations already tried), what is left of the budgets, and two optional
instruments: `screen` (time variants beside the parent, the tuner's successive halving) and
`device_evidence` (compile stats, floors, profiles). Building it writes nothing to the IR; the
instruments report progress through the control channel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tik_tui.agent.base import ProposalContext, config_key, modification_of, module_literal
from tik_tui.agent.control import Control
from tik_tui.agent.state import SearchConfig, SearchState


class ContextBuilder:
    """Builds each step's `ProposalContext`; holds what lives for the whole search (the modification cache,
    one `DeviceEvidence` per operator)."""

    def __init__(self, ws: Any, cfg: SearchConfig, state: SearchState, control: Control, proposer: Any,
                 executor: Any, screen: Callable | None = None):
        self.ws, self.cfg, self.state, self.control = ws, cfg, state, control
        self.proposer, self.executor = proposer, executor
        #: screen(op, parent_source, sources, rounds) -> screen result; default tik_kernels.evaluator.screen
        self._screen = screen
        self._mods: dict[int, dict] = {}
        self._evidence: dict[str, Any] = {}

    def modification(self, impl_id: int) -> dict:
        """An implementation's modification record (immutable, so cached)."""
        if impl_id not in self._mods:
            self._mods[impl_id] = modification_of(self.ws.implementation(impl_id))
        return self._mods[impl_id]

    def _contract(self, op: str) -> dict:
        for row in self.ws.operators():
            if row.get("op") == op:
                c = row.get("contract")
                return json.loads(c) if isinstance(c, str) else dict(c or {})
        return {}

    def build(self, op: str, parent: dict, merge_with: dict | None) -> ProposalContext:
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
            emit=lambda kind, payload: self.control.emit(kind, payload, op=op, impl_id=parent["id"]),
            tokens_left=None if c.max_tokens is None else c.max_tokens - s.tokens,
            dollars_left=None if c.max_cost_usd is None else c.max_cost_usd - s.cost_usd,
            evidence=c.evidence, seed=c.seed + s.spent,
            screen=self.screener(op, parent), screen_width=c.screen,
            device_evidence=self.device_evidence(op) if getattr(self.proposer, "wants_device_evidence", False)
            else None,
        )

    def screener(self, op: str, parent: dict) -> Callable[[list[str], int], dict] | None:
        """The context's `screen` for `parent`, or None where the search does not screen. A screen is a job for
        the executor (`jobs.ScreenJob`): it runs on a slot's device like an evaluation, so it works with any
        number of workers and on Ray, and never times on a GPU an evaluation is using."""
        c = self.cfg
        if c.screen < 2:
            return None
        device = getattr(self.executor, "device", None) or c.device
        if self._screen is None:
            import torch

            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            if not (c.time_it if c.time_it is not None else device.startswith("cuda")):
                return None
        source = self.ws.source(parent["id"])

        def run(sources: list[str], rounds: int) -> dict:
            self.control.heartbeat(op=op, message=f"screening {len(sources)} variant(s) of #{parent['id']}, "
                                   f"{rounds} rounds")
            if self._screen is not None:
                return self._screen(op, source, sources, rounds)
            return self._screen_on_executor(op, source, sources, rounds, device)

        return run

    def _screen_on_executor(self, op: str, source: str, sources: list[str], rounds: int, device: str) -> dict:
        from tik_tui.agent.jobs import ScreenJob

        root = self.ws.root(op)
        job = ScreenJob(op=op, parent_source=source, sources=list(sources), rounds=rounds,
                        root_source=self.ws.source(root["id"]) if root is not None else None,
                        device=device, timeout=self.cfg.timeout)
        out = self.executor.submit(job).result()
        if out.warm_root_failure is not None:
            self.control.emit("warm_root_failed", {"reason": out.warm_root_failure}, op=op)
        if out.screen is not None:
            return out.screen
        why = out.error or out.lost or "no result"
        # the tuner goes on without a screen that failed (as with a screen child that died)
        return {"failure": f"screen job: {why}"[:300], "rounds": rounds, "seconds": 0.0, "parent_objective": None,
                "results": []}

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
