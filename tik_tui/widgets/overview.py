"""The overview: operators with their incumbent (time ×root), the worker, the live event log."""

from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, ProgressBar, RichLog, Sparkline, Static

from tik_tui.agent.pricing import unpriced_use
from tik_tui.events import describe
from tik_tui.widgets import format as fmt
from tik_tui.widgets.keyed_table import KeyedTable
from tik_tui.widgets.model import LIVE_STATES, Snapshot, worker_alive


class OperatorsTable(KeyedTable):
    COLUMNS = (
        ("op", "operator", 12),
        ("root", "root", 6),
        ("incumbent", "incumbent", 9),
        ("ratio", "×root", 7),
        ("frontier", "frontier", 8),
        ("queue", "queue", 5),
        ("derivations", "derivs", 6),
        ("failed", "failed", 6),
    )

    def update_from(self, snap: Snapshot) -> None:
        counts: dict[str, dict[str, int]] = {}
        for row in snap.impls.values():
            c = counts.setdefault(row.get("op"), {})
            c[row.get("status")] = c.get(row.get("status"), 0) + 1
        queued: dict[str, int] = {}
        for q in snap.queue:
            queued[q.get("op")] = queued.get(q.get("op"), 0) + 1
        rows = []
        for op in snap.op_names:
            c = counts.get(op, {})
            root, inc = snap.roots.get(op), snap.incumbents.get(op)
            rows.append((op, (
                op,
                f"#{root}" if root is not None else "—",
                Text(f"#{inc}", style="bold green") if inc is not None and inc != root else Text("root", style="dim"),
                fmt.ratio_text(snap.incumbent_ratio(op) if inc is not None else None),
                str(snap.frontier.get(op, 0)),
                Text(str(queued.get(op, 0)), style="bold magenta" if queued.get(op) else "dim"),
                str(sum(c.values())),
                Text(str(c.get("failed", 0)), style="red" if c.get("failed") else "dim"),
            )))
        self.sync(rows)


class WorkerPanel(Vertical):
    """Worker state, budget progress, cost, and the best time ×root so far (eligible or promoted) as a
    sparkline that falls as the search finds faster derivations."""

    DEFAULT_CSS = """
    WorkerPanel { height: auto; border: round $primary; padding: 0 1; }
    WorkerPanel #worker-line { height: 1; }
    WorkerPanel #worker-message { height: auto; max-height: 2; }
    WorkerPanel Horizontal { height: 1; }
    WorkerPanel ProgressBar { width: 1fr; }
    WorkerPanel #best-label { width: auto; }
    WorkerPanel Sparkline { width: 1fr; height: 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("worker: none", id="worker-line")
        with Horizontal():
            yield Label("budget ", id="budget-label")
            yield ProgressBar(total=1, show_eta=False, id="budget")
            yield Label("  best ", id="best-label")
            yield Sparkline([], id="best")
        yield Static("", id="worker-message")

    def update_from(self, snap: Snapshot, now: float) -> None:
        w = snap.worker or {}
        state = w.get("state") or "none"
        style = {"running": "bold green", "paused": "bold yellow", "crashed": "bold red"}.get(state, "dim")
        line = Text.assemble(("worker ", "bold"), (state, style))
        if state in LIVE_STATES and not worker_alive(w, now):
            line.append(" (no heartbeat: presumed dead)", style="bold red")
        if w.get("pid") and state in LIVE_STATES:
            line.append(f"  pid {w['pid']}")
        if w.get("op"):
            line.append(f"  op {w['op']}")
        if w.get("proposer"):
            line.append(f"  {w['proposer']}")
        if state in LIVE_STATES:
            line.append(f"  heartbeat {fmt.ago(w.get('heartbeat'), now)}", style="dim")
        usage = snap.usage or {}
        cost = fmt.money(usage.get("cost_usd") or 0.0)
        if unpriced_use(usage.get("by_model")):
            # tokens of a model without a price: never shown as $0
            cost = f"{cost} + unknown" if usage.get("cost_usd") else "unknown"
        line.append(f"  cost {cost}")
        toks = (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0)
        line.append(f"  tok {fmt.tokens(toks)}")
        self.query_one("#worker-line", Static).update(line)
        bar = self.query_one("#budget", ProgressBar)
        budget, spent = w.get("budget"), w.get("spent") or 0
        bar.update(total=max(1, int(budget or 1)), progress=min(int(spent), int(budget or 1)) if budget else 0)
        op = w.get("op") if w.get("op") in snap.op_names else None
        op = op or next((o for o in snap.op_names if len(snap.best_series(o)) > 1), None)
        series = snap.best_series(op) if op else []
        best = snap.best(op) if op else None
        self.query_one("#best", Sparkline).data = series or [0.0]
        self.query_one("#best-label", Label).update(
            f"  best {op} #{best[0]} {best[1]:.3f}× root " if best else "  best — ")
        msg = w.get("message") or ""
        bad = state == "crashed" or str(msg).lower().startswith("error")
        self.query_one("#worker-message", Static).update(Text(str(msg), style="bold red" if bad else "dim"))


#: event kinds shown under a shorter name, so the column stays 11 wide
KIND_LABEL = {"implementation": "derivation", "search_started": "search", "search_finished": "search",
              "search_resumed": "search", "proposal_failed": "proposal", "proposal_error": "proposal",
              "resume_evaluate": "evaluating", "eval_retry": "retry", "warm_root_failed": "root"}


def event_line(e: dict, now: float | None = None, ratios: dict[int, float] | None = None) -> Text:
    """`14:03:07 evaluation  rmsnorm #12 candidate → verified, 0.950× root`; `ratios`: id -> time ×root."""
    kind = str(e.get("kind", "?"))
    style = "bold red" if "error" in kind or "crash" in kind else (
        "green" if kind == "decision" else ("magenta" if kind == "evaluation" else ""))
    t = Text(fmt.when(e.get("ts"), now) + " ", style="dim")
    t.append(f"{KIND_LABEL.get(kind, kind)[:11]:<11}", style=style or "bold")
    if e.get("op"):
        t.append(f" {e['op']}")
    if e.get("impl_id") is not None:
        t.append(f" #{e['impl_id']}", style="cyan")
    payload = e.get("payload") or {}
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            payload = {"message": payload}
    impl_id = e.get("impl_id")
    ratio = (ratios or {}).get(int(impl_id)) if impl_id is not None else None
    gist = describe(kind, payload, impl_id=impl_id, ratio=ratio) if isinstance(payload, dict) else str(payload)
    bad = "error" in kind or (isinstance(payload, dict) and payload.get("failure"))
    if gist:
        t.append(" " + gist, style="red" if bad else "")
    return t


class EventLog(RichLog):
    """The event log, newest at the bottom; keeps the last `max_lines` lines."""

    DEFAULT_CSS = "EventLog { height: 1fr; border: round $secondary; }"

    def __init__(self, **kwargs):
        super().__init__(max_lines=2000, wrap=False, markup=False, auto_scroll=True, **kwargs)
        self.count = 0

    def add_events(self, events: list[dict], now: float | None = None, ratios: dict[int, float] | None = None) -> None:
        for e in events:
            self.write(event_line(e, now, ratios))
            self.count += 1
