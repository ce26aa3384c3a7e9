"""The store's error types: workspace problems with a one-line, user-facing message each."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from typing import Any


class WorkspaceError(Exception):
    """A workspace problem with a one-line, user-facing message."""


class UnknownImplementation(WorkspaceError):
    def __init__(self, impl_id: Any):
        super().__init__(f"no implementation #{impl_id} in this workspace")
        self.impl_id = impl_id


class DamagedWorkspace(WorkspaceError):
    """A git object a row names is missing or corrupt (a partial copy, a pruned repository)."""


class ReadOnlyWorkspace(WorkspaceError):
    """This user cannot write the workspace: viewing works, writing does not."""

    def __init__(self, path: Path | str):
        super().__init__(f"workspace {path} is read-only for this user: `tik log`, `tik show`, `tik status` and "
                         "the TUI can view it; writing needs write access to it")


class DiskFull(WorkspaceError):
    def __init__(self, path: Path | str):
        super().__init__(f"disk full: cannot write workspace {path} (free some space and retry; nothing recorded "
                         "was lost)")


def is_disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, sqlite3.Error) and ("disk is full" in str(e) or "SQLITE_FULL" in str(e))


def is_read_only(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    return isinstance(e, sqlite3.Error) and ("readonly" in str(e) or "read-only" in str(e))


def sqlite_problem(e: sqlite3.Error, path: Path | str, db_path: Path | str) -> WorkspaceError:
    """What a sqlite error opening or using the workspace means, in words: a full disk and a read-only
    workspace used to read as "corrupt workspace database"."""
    if is_disk_full(e):
        return DiskFull(path)
    if is_read_only(e) or "unable to open" in str(e):
        return ReadOnlyWorkspace(path)
    if isinstance(e, sqlite3.DatabaseError) and ("malformed" in str(e) or "not a database" in str(e)):
        return WorkspaceError(f"corrupt workspace database {db_path}: {e}")
    return WorkspaceError(f"workspace database {db_path}: {e}")
