"""All derivations in one sortable, filterable table (operator, status, proposer, date, objective)."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.message import Message

from tik_tui.widgets import format as fmt
from tik_tui.widgets.keyed_table import KeyedTable
from tik_tui.widgets.model import Snapshot, parent_of

#: `o` cycles the sort through these (column, reverse)
SORTS = (("id", True), ("ratio", False), ("op", False), ("status", False), ("proposer", False), ("id", False))


def _sort_key(value):
    """Cells are Text or str; numbers sort numerically, a dash sorts last."""
    s = value.plain if isinstance(value, Text) else str(value)
    s = s.lstrip("#").rstrip("×")
    try:
        return (0, float(s), "")
    except ValueError:
        return (1 if s in ("—", "") else 0, 0.0, s)


class HistoryTable(KeyedTable):
    """The newest `max_rows` matching derivations (a DataTable row costs ~1 ms to add: 10,000 would
    freeze the UI for seconds); the filter narrows the rest down."""

    COLUMNS = (
        ("id", "id", 6),
        ("op", "operator", 12),
        ("status", "status", 10),
        ("ratio", "×root", 7),
        ("proposer", "proposer", 10),
        ("parent", "parent", 6),
        ("date", "recorded", 14),
    )

    BINDINGS = [
        Binding("o", "cycle_sort", "Sort", id="history.sort", tooltip="Cycle the sort column"),
        Binding("f", "cycle_filter", "Filter", id="history.filter", tooltip="Cycle the status filter"),
    ]

    class Filtered(Message):
        """The filter changed; the owner re-runs `update_from` (and its count line)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.snap = Snapshot()
        self.text_filter = ""
        self.status_filter: str | None = None
        self.now: float | None = None
        self._sort_i = 0
        self.max_rows = 1000
        #: (rows shown, rows matching the filter, derivations in all)
        self.shown = (0, 0, 0)
        #: id -> (what the row depends on, its cells): unchanged rows are not rebuilt
        self._row_cache: dict[int, tuple[tuple, tuple]] = {}

    def columns_ready(self) -> None:
        self.sort_by("id", key=_sort_key, reverse=True)

    def matches(self, i: int) -> bool:
        row = self.snap.impls[i]
        if self.status_filter and row.get("status") != self.status_filter:
            return False
        if not self.text_filter:
            return True
        hay = f"#{i} {row.get('op')} {row.get('status')} {row.get('proposer')} {row.get('rationale') or ''}".lower()
        return all(word in hay for word in self.text_filter.lower().split())

    def update_from(self, snap: Snapshot, now: float | None = None) -> None:
        self.snap, self.now = snap, now if now is not None else self.now
        rows = []
        matching = [i for i in sorted(snap.impls, reverse=True) if self.matches(i)]
        for i in sorted(matching[:self.max_rows]):
            row = snap.impls[i]
            sig = (row.get("status"), snap.ratios.get(i), row.get("updated"))
            cached = self._row_cache.get(i)
            if cached is not None and cached[0] == sig:
                rows.append((str(i), cached[1]))
                continue
            p = parent_of(row)
            rows.append((str(i), (
                f"#{i}",
                row.get("op") or "",
                fmt.status_text(row.get("status") or ""),
                fmt.ratio_text(snap.ratios.get(i)),
                row.get("proposer") or "",
                f"#{p}" if p is not None else "—",
                fmt.when(row.get("created"), self.now),
            )))
            self._row_cache[i] = (sig, rows[-1][1])
        self.sync(rows)
        self.shown = (len(rows), len(matching), len(snap.impls))

    def set_filter(self, text: str | None = None, status: str | None | bool = False) -> None:
        if text is not None:
            self.text_filter = text
        if status is not False:
            self.status_filter = status
        self.post_message(self.Filtered())

    def action_cycle_sort(self) -> None:
        self._sort_i = (self._sort_i + 1) % len(SORTS)
        col, rev = SORTS[self._sort_i]
        self.sort_by(col, key=_sort_key, reverse=rev)
        self.notify(f"history: sorted by {col}{' (descending)' if rev else ''}", timeout=2)

    def action_cycle_filter(self) -> None:
        from tik_tui.widgets.derivation_tree import FILTERS

        self.set_filter(status=FILTERS[(FILTERS.index(self.status_filter) + 1) % len(FILTERS)])
        self.notify(f"history: showing {self.status_filter or 'all statuses'}", timeout=2)

    def on_data_table_header_selected(self, event: KeyedTable.HeaderSelected) -> None:
        col = event.column_key.value
        rev = self._sort is not None and self._sort[0] == col and not self._sort[2]
        self.sort_by(col, key=_sort_key, reverse=rev)
