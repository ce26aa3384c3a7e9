"""A DataTable updated in place by row key: rows are added, changed cell by cell, or removed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from textual.widgets import DataTable


class KeyedTable(DataTable):
    """`sync(rows)` makes the table show exactly `rows` (key -> cells), touching only what changed."""

    DEFAULT_CSS = "KeyedTable { height: 1fr; }"

    #: (column key, label, width or None)
    COLUMNS: Sequence[tuple[str, str, int | None]] = ()

    def __init__(self, **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._cells: dict[str, tuple] = {}
        self._sort: tuple[str, Callable[[Any], Any] | None, bool] | None = None

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)
        self.columns_ready()

    def columns_ready(self) -> None:
        """Called once the columns exist (Textual runs every class's `on_mount`, so subclasses hook here)."""

    def sync(self, rows: Iterable[tuple[str, tuple]]) -> None:
        rows = dict(rows)
        cols = [c[0] for c in self.COLUMNS]
        for key in [k for k in self._cells if k not in rows]:
            self.remove_row(key)
            del self._cells[key]
        added = False
        for key, cells in rows.items():
            old = self._cells.get(key)
            if old is None:
                self.add_row(*cells, key=key)
                added = True
            elif old is not cells and old != cells:
                for col, new, was in zip(cols, cells, old, strict=True):
                    if new != was:
                        self.update_cell(key, col, new)
            self._cells[key] = cells
        if added and self._sort is not None:
            self._apply_sort()

    def sort_by(self, column: str, key: Callable[[Any], Any] | None = None, reverse: bool = False) -> None:
        self._sort = (column, key, reverse)
        self._apply_sort()

    def _apply_sort(self) -> None:
        column, key, reverse = self._sort
        self.sort(column, key=key, reverse=reverse)

    @property
    def selected_key(self) -> str | None:
        if self.row_count == 0:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None
