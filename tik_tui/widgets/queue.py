"""The promotion queue: eligible candidates with their objective and worst cell."""

from __future__ import annotations

from rich.text import Text

from tik_tui.widgets import format as fmt
from tik_tui.widgets.keyed_table import KeyedTable
from tik_tui.widgets.model import Snapshot


class QueueTable(KeyedTable):
    COLUMNS = (
        ("id", "id", 6),
        ("op", "operator", 12),
        ("ratio", "×root", 7),
        ("vs_inc", "×incumbent", 10),
        ("objective", "objective µs", 12),
        ("worst", "worst cell ×root", None),
        ("proposer", "proposer", 10),
    )

    def update_from(self, snap: Snapshot) -> None:
        rows = []
        for q in snap.queue:
            worst = Text("—", style="dim")
            if q.get("worst_cell") is not None:
                limit = next((c.get("limit") for c in q.get("cells") or () if str(c.get("cell")) == q["worst_cell"]),
                             None)
                worst = Text(f"{q['worst_cell']} ").append_text(
                    fmt.ratio_text(q.get("worst_ratio"), limit=None if limit is None else float(limit)))
            rows.append((str(q["id"]), (
                f"#{q['id']}",
                q.get("op") or "",
                fmt.ratio_text(q.get("ratio")),
                fmt.ratio_text(q.get("vs_incumbent")),
                fmt.us_text(q.get("objective")),
                worst,
                q.get("proposer") or "",
            )))
        self.sync(rows)
