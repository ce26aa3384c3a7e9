"""How values look: status colours, ratios, times, money. Plain functions returning Rich `Text`.

Every ratio is a time ratio (see tik_tui.verdict): the candidate's time over a reference's, same run,
`0.950× root` — below 1 is faster. Names from the store (checks, cells) are `Text`, never markup:
`batch_invariance[permuted]` would otherwise lose its brackets."""

from __future__ import annotations

import time

from rich.text import Text

#: status -> Rich style; `evaluating` is a candidate the worker is evaluating now
STATUS_STYLE = {
    "candidate": "yellow",
    "evaluating": "bold yellow",
    "failed": "red",
    "verified": "cyan",
    "eligible": "bold magenta",
    "promoted": "bold green",
    "rejected": "dim",
}

#: one-letter marks for narrow columns and tree labels
STATUS_MARK = {
    "candidate": "·",
    "evaluating": "…",
    "failed": "✗",
    "verified": "✓",
    "eligible": "★",
    "promoted": "●",
    "rejected": "−",
}


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def ratio_text(ratio: float | None, *, limit: float | None = None, ref: str = "") -> Text:
    """A time ratio (candidate / reference, e.g. `0.950× root`): below 1 is faster. Red beyond `1 + limit`."""
    if ratio is None:
        return Text("—", style="dim")
    style = "green" if ratio < 0.995 else ""
    if limit is not None and ratio > 1 + limit:
        style = "bold red"
    elif ratio > 1.005:
        style = "yellow"
    return Text(f"{ratio:.3f}×" + (f" {ref}" if ref else ""), style=style)


def name_text(name, style: str = "") -> Text:
    """A name from the store shown literally (no markup)."""
    return Text("" if name is None else str(name), style=style)


def us_text(us: float | None) -> str:
    if us is None:
        return "—"
    return f"{us:,.1f}" if us < 10_000 else f"{us:,.0f}"


def money(usd: float | None) -> str:
    return "—" if usd is None else f"${usd:,.2f}"


def tokens(n: int | None) -> str:
    if not n:
        return "0"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else str(n))


def parse_time(value) -> float | None:
    """Seconds since the epoch from a store timestamp (epoch number or ISO-8601 text)."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(value)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def when(value, now: float | None = None) -> str:
    """`14:03:07` today, `12-01 14:03` before; UTC so that every viewer of a shared workspace agrees."""
    t = parse_time(value)
    if t is None:
        return "—"
    now = time.time() if now is None else now
    fmt = "%H:%M:%S" if abs(now - t) < 86_400 else "%m-%d %H:%M"
    return time.strftime(fmt, time.gmtime(t))


def ago(value, now: float | None = None) -> str:
    t = parse_time(value)
    if t is None:
        return "never"
    s = max(0.0, (time.time() if now is None else now) - t)
    if s < 60:
        return f"{s:.0f}s ago"
    if s < 3600:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"
