"""The optimization IR: SQLite rows (`tik.db`) + a git repository of implementations (`repo/`).

    from tik_store import Workspace, WorkspaceError, STATUSES
    with Workspace.open(path) as ws:
        ws.frontier("rmsnorm")

No torch, triton, textual or anthropic here (tests/test_layering.py).
"""

from tik_store.channel import Channel
from tik_store.errors import UnknownImplementation, WorkspaceError
from tik_store.schema import ACTIONS, STATUSES, WORKER_STATES
from tik_store.workspace import Workspace

__all__ = ["ACTIONS", "STATUSES", "WORKER_STATES", "Channel", "UnknownImplementation", "Workspace", "WorkspaceError"]
