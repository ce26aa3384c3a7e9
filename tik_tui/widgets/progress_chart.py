"""Per operator, the time ×root of every timed derivation in the order they were recorded: a scatter plot in
text, one column per derivation, with the incumbent's level drawn as a line and promotions marked ●.

    rmsnorm  1.08 ┤ ·
                  │   ·  ★
             0.91 ┤━━━━●━━━━━━━━   (━ the incumbent at that point; lower is faster)
"""

from __future__ import annotations

from rich.text import Text

from tik_tui.widgets import format as fmt
from tik_tui.widgets.model import Snapshot

#: status -> plotted glyph (failed and unevaluated derivations have no time and are counted below the plot)
GLYPH = {"promoted": "●", "eligible": "★", "verified": "·", "rejected": "−"}


def chart(snap: Snapshot, op: str, *, width: int = 80, height: int = 7) -> Text:
    """One operator's plot; `width` includes the 14-column axis."""
    series = snap.series(op)
    n_all = sum(1 for r in snap.impls.values() if r.get("op") == op)
    t = Text()
    t.append(f"{op}", style="bold")
    untimed = n_all - len(series)
    t.append(f"  {len(series)} timed derivation(s)" + (f", {untimed} failed or untimed" if untimed else ""),
             style="dim")
    if len(series) < 2:
        return t.append("\n  " + ("nothing timed yet" if not series else "only the root so far") + "\n", style="dim")
    cols = max(10, width - 14)
    shown = series[-cols:]
    if len(series) > cols:
        t.append(f"  (the last {cols})", style="dim")
    t.append("\n")
    # the incumbent's level at each point: the latest promoted derivation so far (the root before any)
    level, levels = snap.ratios.get(snap.roots.get(op)), []
    for _i, r, status in series:
        if status == "promoted":
            level = r
        levels.append(level)
    levels = levels[-cols:]
    values = [r for _, r, _ in shown] + [v for v in levels if v is not None]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.01, hi + 0.01

    def y(v: float | None) -> int | None:
        return None if v is None else round((hi - v) / (hi - lo) * (height - 1))

    point_y = [y(r) for _, r, _ in shown]
    level_y = [y(v) for v in levels]
    # a few columns per derivation while they are few, so the plot reads left to right
    step = max(1, min(3, cols // len(shown)))
    for row in range(height):
        label = f"{hi:.3f}×" if row == 0 else (f"{lo:.3f}×" if row == height - 1 else "")
        t.append(f"{label:>12} {'┤' if label else '│'}", style="dim")
        for k, (_i, _r, status) in enumerate(shown):
            line = "━" if level_y[k] == row else " "
            # the incumbent's line runs on to the next point
            t.append(line * (step - 1), style="green")
            if point_y[k] == row:
                t.append(GLYPH.get(status, "?"), style=fmt.STATUS_STYLE.get(status, ""))
            else:
                t.append(line, style="green")
        t.append("\n")
    axis = f"#{shown[0][0]}" + (f" … #{shown[-1][0]}" if len(shown) > 1 else "")
    t.append(" " * 13 + "└" + "─" * (len(shown) * step) + f" {axis}\n", style="dim")
    return t


def charts(snap: Snapshot, *, width: int = 80) -> Text:
    if not snap.op_names:
        return Text("no operators", style="dim")
    t = Text("time ×root of every timed derivation, oldest left (lower is faster); ", style="dim")
    t.append("━", style="green").append(" the incumbent then  ", style="dim")
    for status, glyph in GLYPH.items():
        t.append(glyph, style=fmt.STATUS_STYLE.get(status, "")).append(f" {status}  ", style="dim")
    t.append("\n\n")
    for op in snap.op_names:
        t.append_text(chart(snap, op, width=width)).append("\n")
    return t
