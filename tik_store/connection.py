"""The workspace's sqlite connections: one per thread, WAL, foreign keys on, a 30 s busy timeout.

A worker process and any number of viewer processes share one `tik.db`; write transactions are
`BEGIN IMMEDIATE`, so two writers queue instead of failing on a lock upgrade. A read-only open
(`readonly=True`) makes every connection `query_only`. Both the IR record (`Workspace`) and the
control channel (`Channel`) sit on this.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tik_store.db import Database
from tik_store.errors import WorkspaceError, sqlite_problem

DB_NAME = "tik.db"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _j(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _loads(text: str | None, default: Any = None) -> Any:
    """A JSON column's value; text that is not JSON comes back as it is."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class Connections:
    """Per-thread connections to `<path>/tik.db` (reopened after a fork), closed together by `close()`."""

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        self.db_path = self.path / DB_NAME
        self.readonly = readonly
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()

    def _now(self) -> str:
        """The timestamp rows are written with."""
        return now()

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "conn", None) is None or local.pid != os.getpid():
            try:
                conn = self._connect_readonly() if self.readonly else self._connect("")
                conn.execute("PRAGMA synchronous=NORMAL") if not self.readonly else None
            except sqlite3.DatabaseError as e:
                raise sqlite_problem(e, self.path, self.db_path) from None
            local.conn, local.pid, local.db = conn, os.getpid(), Database(conn)
            with self._conns_lock:
                self._conns.append(conn)
        return local.conn

    def _connect(self, mode: str) -> sqlite3.Connection:
        """A connection; `mode` is a sqlite URI query (`mode=ro`, `immutable=1`), "" for the default."""
        target = f"file:{urllib.parse.quote(str(self.db_path.absolute()))}?{mode}" if mode else self.db_path
        conn = sqlite3.connect(target, timeout=30.0, isolation_level=None, check_same_thread=False, uri=bool(mode))
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
        if self.readonly:
            conn.execute("PRAGMA query_only=ON")
        return conn

    def _connect_readonly(self) -> sqlite3.Connection:
        """The viewer's connection. A WAL database needs its `-shm` file, which a user without write access
        cannot create: then open it `mode=ro` (works while a writer keeps `-shm` alive), else `immutable=1`
        (no writer has it open: there is no `-wal` to miss)."""
        last: sqlite3.Error | None = None
        for mode in ("", "mode=ro", "immutable=1"):
            if mode == "immutable=1" and self.db_path.with_name(DB_NAME + "-wal").exists():
                break
            try:
                conn = self._connect(mode)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            except sqlite3.OperationalError as e:
                last = e
                if "readonly" not in str(e) and "unable to open" not in str(e):
                    raise
        raise last

    @property
    def db(self) -> Database:
        self._conn()
        return self._local.db

    @contextmanager
    def _tx(self) -> Iterator[Database]:
        """A write transaction (`BEGIN IMMEDIATE`); nested uses become savepoints."""
        if self.readonly:
            raise WorkspaceError(f"{self.path} was opened read-only")
        conn, db = self._conn(), self.db
        if conn.in_transaction:
            with db.atomic():
                yield db
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
