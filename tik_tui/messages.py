"""Messages the app sends to its screens after the store thread answers."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

from tik_tui.widgets.model import Snapshot


@dataclass
class Refreshed(Message):
    """A poll found something new: the latest snapshot, and the events since the previous poll."""

    snapshot: Snapshot
    events: list[dict] = field(default_factory=list)
    #: candidates the worker is evaluating now
    evaluating: set[int] = field(default_factory=set)


@dataclass
class Decided(Message):
    """A decision was written through the store (by this UI)."""

    impl_id: int
    action: str
