"""The control channel between the UI/CLI and the worker, beside the IR record in the same `tik.db`.

- events: an append-only log viewers poll (`events_since`); the IR's own writes add theirs in
  the same transaction as the rows they describe, so a viewer never sees one without the other;
- commands: the UI→worker queue (`pause`, `resume`, `stop`), each taken once;
- worker state: one row (state, pid, host, spending, message; anything else in `extra`) whose
  `heartbeat` says whether the worker is alive.

`Workspace` is a `Channel` plus the record. A process that needs only the channel (the worker's
heartbeat thread) opens `Channel.open(path)`: no git repository, no repair of a half-done write.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from tik_store.connection import DB_NAME, Connections, _j, _loads
from tik_store.db import Database
from tik_store.errors import WorkspaceError
from tik_store.schema import WORKER_STATES

#: a worker whose heartbeat is older than this is presumed dead (the worker beats every few seconds)
STALE_HEARTBEAT_S = 120.0
WORKER_FIELDS = ("pid", "host", "state", "op", "proposer", "budget", "spent", "heartbeat", "message")


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Channel(Connections):
    """Events, commands and the worker's state in `<path>/tik.db`."""

    @classmethod
    def open(cls, path: Path | str, *, readonly: bool = False) -> Channel:
        """The channel of an existing workspace, alone."""
        path = Path(path)
        if not (path / DB_NAME).is_file():
            raise WorkspaceError(f"no TIK workspace at {path} (run `tik init`)")
        return cls(path, readonly=readonly)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ events

    def _event(self, db: Database, kind: str, payload: dict, op: str | None = None,
               impl_id: int | None = None) -> int:
        """An event inside the caller's transaction `db`."""
        cur = db.execute("INSERT INTO events (ts, kind, op, impl_id, payload) VALUES (?, ?, ?, ?, ?)",
                         [self._now(), kind, op, impl_id, _j(payload)])
        return int(cur.lastrowid)

    def append_event(self, kind: str, payload: dict, *, op: str | None = None, impl_id: int | None = None) -> int:
        with self._tx() as db:
            return self._event(db, kind, payload, op, impl_id)

    def _event_rows(self, sql: str, params: list) -> list[dict]:
        rows = list(self.db.query(sql, params))
        for r in rows:
            r["payload"] = _loads(r["payload"], {})
        return rows

    def events_since(self, last_id: int = 0, limit: int = 500) -> list[dict]:
        return self._event_rows("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", [int(last_id), int(limit)])

    def events(self, kind: str | None = None, op: str | None = None, impl_id: int | None = None) -> list[dict]:
        """Events of one kind / operator / implementation (each filter optional), oldest first."""
        where, params = [], []
        for col, val in (("kind", kind), ("op", op), ("impl_id", impl_id)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        return self._event_rows("SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "")
                                + " ORDER BY id", params)

    def last_event_id(self) -> int:
        return int(self.db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0])

    # ------------------------------------------------------------------ commands

    def send_command(self, kind: str, payload: dict | None = None) -> int:
        with self._tx() as db:
            cur = db.execute("INSERT INTO commands (kind, payload, created) VALUES (?, ?, ?)",
                             [kind, _j(payload or {}), self._now()])
            cid = int(cur.lastrowid)
            self._event(db, "command", {"id": cid, "kind": kind, "payload": payload or {}})
        return cid

    def take_commands(self) -> list[dict]:
        """Pending commands, oldest first, marked done in the same transaction (each is taken once)."""
        with self._tx() as db:
            rows = list(db.query("SELECT * FROM commands WHERE done IS NULL ORDER BY id"))
            t = self._now()
            for r in rows:
                db.execute("UPDATE commands SET done = ? WHERE id = ?", [t, r["id"]])
        return [{**r, "payload": json.loads(r["payload"]), "done": t} for r in rows]

    # ------------------------------------------------------------------ the worker

    def set_worker_state(self, **fields: Any) -> None:
        """Update the worker's row; every call refreshes the heartbeat (unless one is given).
        Fields outside the known ones are kept in `extra`."""
        if "state" in fields and fields["state"] not in WORKER_STATES:
            raise WorkspaceError(f"unknown worker state {fields['state']!r} (one of {', '.join(WORKER_STATES)})")
        known = {k: v for k, v in fields.items() if k in WORKER_FIELDS}
        extra = {k: v for k, v in fields.items() if k not in WORKER_FIELDS}
        hb = known.get("heartbeat")
        known["heartbeat"] = time.time() if hb in (None, True) else float(hb)
        if "pid" in known and "host" not in known:
            known["host"] = socket.gethostname()
        with self._tx() as db:
            old = list(db.query("SELECT * FROM worker_state WHERE id = 1"))
            if not old:
                db.execute("INSERT INTO worker_state (id, state, updated) VALUES (1, 'idle', ?)", [self._now()])
                old = list(db.query("SELECT * FROM worker_state WHERE id = 1"))
            merged_extra = {**json.loads(old[0]["extra"] or "{}"), **extra}
            sets = ", ".join(f"{k} = ?" for k in known)
            db.execute(f"UPDATE worker_state SET {sets}, extra = ?, updated = ? WHERE id = 1",
                       [*known.values(), _j(merged_extra), self._now()])
            if "state" in known and known["state"] != old[0]["state"]:
                self._event(db, "worker", {"from": old[0]["state"], "state": known["state"],
                                           "message": known.get("message")}, known.get("op"))

    def worker_state(self) -> dict:
        """The worker's row plus `alive` (its process exists / it beat recently) and `heartbeat_age_s`."""
        rows = list(self.db.query("SELECT * FROM worker_state WHERE id = 1"))
        w = rows[0] if rows else {"state": "idle", "pid": None, "host": None, "heartbeat": None, "extra": "{}"}
        w.pop("id", None)
        w.update(_loads(w.pop("extra", "{}"), {}) or {})
        age = None if w.get("heartbeat") is None else max(0.0, time.time() - w["heartbeat"])
        w["heartbeat_age_s"] = age
        if w.get("host") == socket.gethostname() and w.get("pid"):
            w["alive"] = pid_alive(w["pid"]) and age is not None and age < STALE_HEARTBEAT_S
        else:
            w["alive"] = age is not None and age < STALE_HEARTBEAT_S and w.get("state") in ("running", "paused")
        return w
