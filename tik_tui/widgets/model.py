"""What the UI knows about a workspace, and the one thread that reads it.

Every store call of the UI runs on a single background thread that owns the `Workspace`
(sqlite connections are per thread; GitPython handles are not shared), so the UI thread never
waits on sqlite or git. Screens await `StoreClient.call(fn)`; the app polls `events_since` and
re-reads a `Snapshot` when something happened (or every `resync_s` as a safety net).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: worker states in which the worker process is alive
LIVE_STATES = ("running", "paused")
#: statuses whose derivations could stand as the incumbent (what "best" may point at)
BEST_STATUSES = ("eligible", "promoted")


#: a worker whose heartbeat is older than this is presumed dead (it beats every few seconds)
STALE_HEARTBEAT_S = 120.0


def worker_alive(worker: dict, now: float) -> bool:
    """Running or paused, with a recent heartbeat, and (on this host) its process exists."""
    if worker.get("state") not in LIVE_STATES:
        return False
    from tik_tui.widgets.format import parse_time

    beat = parse_time(worker.get("heartbeat"))
    if beat is None or now - beat >= STALE_HEARTBEAT_S:
        return False
    if worker.get("pid") and worker.get("host") == socket.gethostname():
        try:
            os.kill(int(worker["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


class StoreClient:
    """A workspace opened on its own thread; `call(fn, *args)` runs `fn(ws, *args)` there."""

    def __init__(self, path: Path, opener: Callable[[Path], Any] | None = None):
        self.path = Path(path)
        self._opener = opener
        self._ws = None
        self.readonly = False
        """True when this user cannot write the workspace: it is open for viewing only."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tik-store")

    def _workspace(self):
        if self._ws is None:
            if self._opener is not None:
                self._ws = self._opener(self.path)
            else:
                from tik_store import Workspace
                from tik_store.errors import ReadOnlyWorkspace

                try:
                    self._ws = Workspace.open(self.path)
                except ReadOnlyWorkspace:
                    # a viewer without write access (over SSH, someone else's workspace): look, do not touch
                    self._ws = Workspace.open(self.path, readonly=True)
                    self.readonly = True
        return self._ws

    async def call(self, fn: Callable[..., Any], *args) -> Any:
        return await asyncio.wrap_future(self._pool.submit(lambda: fn(self._workspace(), *args)))

    def close(self) -> None:
        def _close():
            if self._ws is not None and hasattr(self._ws, "close"):
                self._ws.close()
            self._ws = None

        self._pool.submit(_close)
        self._pool.shutdown(wait=True, cancel_futures=False)


def parent_of(impl: dict) -> int | None:
    """First parent id of an implementation row (`parent_id`, `parent`, or a `parents` list)."""
    for key in ("parent_id", "parent"):
        if impl.get(key) is not None:
            return int(impl[key])
    parents = impl.get("parents") or ()
    return int(parents[0]) if parents else None


def objective(cells: list[dict]) -> tuple[float | None, float | None]:
    """(Σ c·median, Σ c·root median in the same run) over a measurement's cells."""
    if not cells:
        return None, None
    obj = sum(float(c.get("coeff") or 1.0) * float(c["median_us"]) for c in cells if c.get("median_us") is not None)
    root_vals = [c.get("root_median_us") for c in cells]
    root = None
    if all(v is not None for v in root_vals):
        root = sum(float(c.get("coeff") or 1.0) * float(c["root_median_us"]) for c in cells)
    return obj, root


def worst_cell(cells: list[dict]) -> tuple[str | None, float | None]:
    """The cell with the highest ratio to the root, and that ratio."""
    best = (None, None)
    for c in cells:
        r = c.get("ratio_vs_root")
        if r is None and c.get("root_median_us") and c.get("median_us") is not None:
            r = float(c["median_us"]) / float(c["root_median_us"])
        if r is not None and (best[1] is None or r > best[1]):
            best = (str(c.get("cell")), float(r))
    return best


@dataclass
class Snapshot:
    """One consistent read of the workspace, taken on the store thread."""

    operators: list[dict] = field(default_factory=list)
    impls: dict[int, dict] = field(default_factory=dict)
    roots: dict[str, int | None] = field(default_factory=dict)
    incumbents: dict[str, int | None] = field(default_factory=dict)
    frontier: dict[str, int] = field(default_factory=dict)
    queue: list[dict] = field(default_factory=list)
    worker: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)
    #: id -> objective ratio to the root (same-run root timing when the evaluator recorded it)
    ratios: dict[int, float] = field(default_factory=dict)
    taken_at: float = 0.0

    @property
    def op_names(self) -> list[str]:
        return [o.get("op") or o.get("name") for o in self.operators]

    def children(self) -> dict[int | None, list[int]]:
        kids: dict[int | None, list[int]] = {}
        for i in sorted(self.impls):
            kids.setdefault(parent_of(self.impls[i]), []).append(i)
        return kids

    def incumbent_ratio(self, op: str) -> float | None:
        """The incumbent's time over the root's (below 1: the search made `op` faster)."""
        inc = self.incumbents.get(op)
        return self.ratios.get(inc) if inc is not None else None

    def best(self, op: str) -> tuple[int, float] | None:
        """(id, time ×root) of the fastest derivation of `op` that could replace the incumbent: eligible or
        promoted. A verified one is not: it failed a limit or did not beat the incumbent in its run."""
        best = None
        for i, row in self.impls.items():
            r = self.ratios.get(i)
            if row.get("op") == op and row.get("status") in BEST_STATUSES and r is not None:
                if best is None or (r, i) < (best[1], best[0]):
                    best = (i, r)
        return best

    def best_series(self, op: str) -> list[float]:
        """Running best time ×root over the eligible and promoted derivations of `op`, in recording order
        (falls, never rises)."""
        out, best = [], None
        for i in sorted(self.impls):
            row = self.impls[i]
            if row.get("op") != op or row.get("status") not in BEST_STATUSES:
                continue
            r = self.ratios.get(i)
            if r:
                best = r if best is None else min(best, r)
            if best is not None:
                out.append(best)
        return out

    def series(self, op: str) -> list[tuple[int, float, str]]:
        """(id, time ×root, status) of every timed derivation of `op`, in recording order."""
        return [(i, self.ratios[i], self.impls[i].get("status")) for i in sorted(self.impls)
                if self.impls[i].get("op") == op and i in self.ratios]


@dataclass
class PollResult:
    events: list[dict]
    worker: dict
    snapshot: Snapshot | None


class Poller:
    """State of the polling loop. `poll(ws)` runs on the store thread."""

    def __init__(self, resync_s: float = 15.0, clock: Callable[[], float] = time.time, backlog: int = 200):
        self.last_event_id = 0
        self.backlog = backlog
        self.resync_s = resync_s
        self.clock = clock
        self._last_full = None
        #: id -> (status, same-run ratio): measurements are read once per (id, status)
        self._ratio_cache: dict[int, tuple[str, float | None]] = {}

    def poll(self, ws) -> PollResult:
        if self._last_full is None and self.last_event_id == 0 and hasattr(ws, "last_event_id"):
            # a long-lived workspace has tens of thousands of events: show only the recent ones
            self.last_event_id = max(0, ws.last_event_id() - self.backlog)
        events = list(ws.events_since(self.last_event_id, limit=500))
        if events:
            self.last_event_id = max(int(e["id"]) for e in events)
        worker = ws.worker_state() or {}
        now = self.clock()
        snap = None
        if events or self._last_full is None or now - self._last_full >= self.resync_s:
            snap = self.snapshot(ws)
            snap.worker = worker
            self._last_full = now
        return PollResult(events=events, worker=worker, snapshot=snap)

    def snapshot(self, ws) -> Snapshot:
        snap = Snapshot(taken_at=self.clock())
        snap.operators = list(ws.operators())
        snap.impls = {int(r["id"]): r for r in ws.implementations()}
        for name in snap.op_names:
            root = ws.root(name)
            inc = ws.incumbent(name)
            snap.roots[name] = int(root["id"]) if root else None
            snap.incumbents[name] = int(inc["id"]) if inc else None
            snap.frontier[name] = len(ws.frontier(name))
        for i, row in snap.impls.items():
            r = self._ratio(ws, row, snap)
            if r is not None:
                snap.ratios[i] = r
        snap.queue = [self._queue_row(ws, q, snap) for q in ws.promotion_queue()]
        snap.usage = ws.llm_usage_totals() or {}
        return snap

    def _ratio(self, ws, row: dict, snap: Snapshot) -> float | None:
        """Objective / the root's objective; when the root has none recorded, the root timing of
        the same run (one measurements read, cached per (id, status))."""
        op, i = row.get("op"), int(row["id"])
        root_id = snap.roots.get(op)
        if root_id == i:
            return 1.0
        if row.get("status") in ("failed", "candidate"):
            return None
        root_obj = (snap.impls.get(root_id) or {}).get("objective") if root_id is not None else None
        if row.get("objective") is not None and root_obj:
            return float(row["objective"]) / float(root_obj)
        cached = self._ratio_cache.get(i)
        if cached is None or cached[0] != row.get("status"):
            obj, same_run_root = objective(ws.measurements(i))
            cached = (row.get("status"), obj / same_run_root if obj is not None and same_run_root else None)
            self._ratio_cache[i] = cached
        return cached[1]

    @staticmethod
    def _queue_row(ws, q: dict, snap: Snapshot) -> dict:
        i = int(q["id"])
        row = dict(snap.impls.get(i, {}), **q)
        cells = ws.measurements(i)
        obj, _ = objective(cells)
        row["objective"] = obj
        row["ratio"] = snap.ratios.get(i)
        row["worst_cell"], row["worst_ratio"] = worst_cell(cells)
        row["cells"] = cells
        inc = [c.get("incumbent_median_us") for c in cells]
        if cells and all(v is not None for v in inc):
            inc_obj = sum(float(c.get("coeff") or 1.0) * float(c["incumbent_median_us"]) for c in cells)
            row["vs_incumbent"] = obj / inc_obj if inc_obj else None
        else:
            row["vs_incumbent"] = None
        return row


def load_detail(ws, impl_id: int) -> dict:
    """Everything the detail screen shows for one derivation (runs on the store thread)."""
    impl = ws.implementation(impl_id)
    if impl is None:
        raise KeyError(impl_id)
    op = impl.get("op")
    root = ws.root(op)
    inc = ws.incumbent(op)
    detail = {
        "impl": impl,
        "source": ws.source(impl_id),
        "diff": ws.diff(impl_id) if parent_of(impl) is not None else "",
        "checks": list(ws.checks(impl_id)),
        "cells": list(ws.measurements(impl_id)),
        "lineage": [int(r["id"]) if isinstance(r, dict) else int(r) for r in ws.lineage(impl_id)],
        "children": [int(r["id"]) if isinstance(r, dict) else int(r) for r in ws.children(impl_id)],
        "decisions": list(ws.decisions(impl_id)),
        "root_id": int(root["id"]) if root else None,
        "incumbent_id": int(inc["id"]) if inc else None,
    }
    return detail


def load_compare(ws, impl_id: int) -> dict:
    """Candidate vs the incumbent of its operator: both cell tables and the diff between them."""
    impl = ws.implementation(impl_id)
    if impl is None:
        raise KeyError(impl_id)
    inc = ws.incumbent(impl.get("op")) or ws.root(impl.get("op"))
    inc_id = int(inc["id"]) if inc else None
    return {
        "impl": impl,
        "incumbent": inc,
        "cells": list(ws.measurements(impl_id)),
        "incumbent_cells": list(ws.measurements(inc_id)) if inc_id is not None else [],
        "diff": ws.diff(impl_id, against=inc_id) if inc_id is not None and inc_id != impl_id else "",
    }
