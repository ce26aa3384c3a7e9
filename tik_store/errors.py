"""The store's one error type: a workspace problem with a one-line, user-facing message."""

from __future__ import annotations

from typing import Any


class WorkspaceError(Exception):
    """A workspace problem with a one-line, user-facing message."""


class UnknownImplementation(WorkspaceError):
    def __init__(self, impl_id: Any):
        super().__init__(f"no implementation #{impl_id} in this workspace")
        self.impl_id = impl_id
