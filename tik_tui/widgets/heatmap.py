"""A candidate's cells as a heatmap: one row per workload (model/phase), one chip per size, coloured by the
time ratio to the root (against each cell's limit) and to the incumbent.

    vs root (limit 1.05×)      qwen3-8b/decode   T=1 0.912  T=8 0.934  T=64 1.143!  T=256 0.97
    vs incumbent               qwen3-8b/decode   T=1 0.988  ...

Green is faster, grey about even, yellow slower but within the limit, red beyond it (marked `!`, so the
picture reads without colour too)."""

from __future__ import annotations

import re

from rich.text import Text

from tik_tui.verdict import cell_limit, cell_ratio, cell_vs_incumbent

#: (lower bound of the ratio, background): faster is greener
_FASTER = ((0.80, "#1e6b2e"), (0.90, "#2f7d3c"), (0.97, "#3f6f45"), (0.995, "#4a5a4c"))
_EVEN = "#4a4a4a"
_SLOWER = "#7a6a1e"
_OVER = "#9b2226"


def split_cell(name: str) -> tuple[str, str]:
    """(workload, size): `qwen3-8b/decode[T=1,H=4096]` -> (`qwen3-8b/decode`, `T=1`); `o[N=4096,K=4096]/M=8` ->
    (`o[N=4096,K=4096]`, `M=8`). A name of neither shape is its own workload."""
    m = re.fullmatch(r"(.+)\[([^\]]*)\]", name)
    if m:
        return m.group(1), m.group(2).split(",")[0]
    head, sep, tail = name.rpartition("/")
    return (head, tail) if sep else (name, "")


def colour(ratio: float, limit: float | None) -> str:
    if limit is not None and ratio > limit:
        return _OVER
    if ratio > 1.005:
        return _SLOWER
    for bound, bg in _FASTER:
        if ratio < bound:
            return bg
    return _EVEN


def _rows(cells: list[dict]) -> dict[str, list[tuple[str, dict]]]:
    rows: dict[str, list[tuple[str, dict]]] = {}
    for c in cells:
        work, size = split_cell(str(c.get("cell")))
        rows.setdefault(work, []).append((size, c))
    return rows


def heatmap(cells: list[dict], *, against: str = "root", width: int = 100) -> Text:
    """The map of `cells` against `root` (each cell's limit applies) or `incumbent` (no limit: 1.0 is the bar)."""
    ratio_of = cell_ratio if against == "root" else cell_vs_incumbent
    rows = _rows(cells)
    out = Text()
    if not any(ratio_of(c) is not None for c in cells):
        return Text(f"no timings against the {against} yet", style="dim")
    label_w = min(max((len(w) for w in rows), default=8), 34)
    for work, entries in rows.items():
        label = work if len(work) <= label_w else "…" + work[-(label_w - 1):]
        out.append(f"{label:<{label_w}} ", style="bold")
        used = label_w + 1
        for size, c in entries:
            r = ratio_of(c)
            lim = cell_limit(c) if against == "root" else 1.0
            chip = f" {size} {'—' if r is None else f'{r:.3f}'}{'!' if r is not None and lim and r > lim else ' '}"
            if used + len(chip) + 1 > width:
                out.append("\n" + " " * (label_w + 1))
                used = label_w + 1
            out.append(chip, style="dim" if r is None else f"white on {colour(r, lim if against == 'root' else None)}")
            out.append(" ")
            used += len(chip) + 1
        out.append("\n")
    return out


def legend(cells: list[dict]) -> Text:
    limits = sorted({round(lim, 4) for c in cells if (lim := cell_limit(c)) is not None})
    lim = "/".join(f"{v:.2f}×" for v in limits) or "—"
    t = Text("time ratio per cell (below 1 is faster): ", style="dim")
    for label, bg in (("faster", _FASTER[1][1]), ("even", _EVEN), ("slower", _SLOWER), ("over limit !", _OVER)):
        t.append(f" {label} ", style=f"white on {bg}")
        t.append(" ")
    t.append(f"  limit vs root: {lim}", style="dim")
    return t


def cell_maps(cells: list[dict], width: int = 100) -> Text:
    """Both maps with their titles and the legend: what the detail view and the queue show."""
    t = Text()
    t.append_text(legend(cells)).append("\n\n")
    t.append("vs root\n", style="bold underline")
    t.append_text(heatmap(cells, against="root", width=width)).append("\n")
    t.append("vs incumbent (same run)\n", style="bold underline")
    t.append_text(heatmap(cells, against="incumbent", width=width))
    return t
