"""The search's side of the control channel: events out, heartbeat out, commands in.

Everything a viewer (the UI, `tik log`, `tik status`) learns about a running search goes
through here into the store, and the only thing that comes back is a command (`pause`,
`resume`, `stop`) or the process's own stop flag (SIGTERM, Ctrl-C).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tik_tui.agent.state import SearchConfig, SearchState


class Control:
    def __init__(self, ws: Any, cfg: SearchConfig, state: SearchState, *,
                 on_event: Callable[[str, dict], None] | None = None, should_stop: Callable[[], bool] | None = None):
        self.ws, self.cfg, self.state = ws, cfg, state
        self.on_event = on_event
        self.should_stop = should_stop or (lambda: False)

    def emit(self, kind: str, payload: dict, *, op: str | None = None, impl_id: int | None = None) -> None:
        """Append an event (tagged with the search id) and pass it to `on_event`."""
        payload = {"search": self.state.search_id, **payload}
        self.ws.append_event(kind, payload, op=op, impl_id=impl_id)
        if self.on_event is not None:
            self.on_event(kind, {**payload, "op": op, "impl_id": impl_id})

    def heartbeat(self, **fields) -> None:
        """The worker state viewers read: running or paused, spending so far, and `fields` (op, message, ...)."""
        s = self.state
        self.ws.set_worker_state(
            state="paused" if s.paused else "running", heartbeat=time.time(), spent=s.spent,
            budget=self.cfg.budget, search=s.search_id, tokens=s.tokens,
            cost_usd=None if s.cost_unknown else round(s.cost_usd, 6),
            started=s.started, **fields)

    def poll_commands(self) -> None:
        """Apply the commands queued since the last poll: pause, resume, stop."""
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

    def stopping(self) -> bool:
        """True once anything has asked the search to stop (a command, a budget, the process's stop flag)."""
        if self.should_stop():
            self.state.stop_reason = self.state.stop_reason or "terminated (SIGTERM)"
        return self.state.stop_reason is not None
