"""The three calls the store makes on a sqlite3 connection: `execute`, `query` (rows as dicts), `atomic`.

The connection runs in autocommit mode (`isolation_level=None`): a transaction is only ever the
`BEGIN IMMEDIATE` the workspace opens, and `atomic()` nests as savepoints inside it. This replaces
sqlite-utils, whose import (it pulls in numpy) was ~0.15 s of every `tik` process and whose
`query()` wrapped each read in a savepoint.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import count
from typing import Any

_savepoints = count()


def _keys(cursor: sqlite3.Cursor) -> list[str]:
    """Column names, a repeated one suffixed `_2`, `_3`... (as sqlite-utils did), so no value is lost."""
    keys: list[str] = []
    seen: set[str] = set()
    for d in cursor.description:
        key, n = d[0], 1
        while key in seen:
            n += 1
            key = f"{d[0]}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


class Database:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict]:
        """Rows as dicts; the statement runs now, rows are fetched as the iterator is consumed."""
        cursor = self.conn.execute(sql, params)
        if cursor.description is None:
            raise ValueError("query() is for statements that return rows; use execute()")
        keys = _keys(cursor)
        return (dict(zip(keys, row, strict=True)) for row in cursor)

    @contextmanager
    def atomic(self) -> Iterator[Database]:
        """A savepoint inside the open transaction (a transaction of its own when none is open)."""
        name = f"tik_{next(_savepoints)}"
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield self
        except BaseException:
            # an error can end the whole transaction (savepoints included): then there is nothing to undo
            if self.conn.in_transaction:
                self.conn.execute(f"ROLLBACK TO {name}")
                self.conn.execute(f"RELEASE {name}")
            raise
        self.conn.execute(f"RELEASE {name}")
