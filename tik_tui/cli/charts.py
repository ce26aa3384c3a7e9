"""Terminal charts for `tik bench` and `tik e2e`, and a progress line while they run. Plain text: they go to a
pipe or a log as well as to a terminal (colour only on a terminal).

    qwen3-8b/decode[T=1,H=4096]         ████│     ┊    0.950× root     (left of │ faster, ┊ the limit)
    qwen3-8b/decode[T=8,H=4096]             │███████ 1.143× root  over its limit
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator


def _colour(text: str, code: str) -> str:
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{code}m{text}\033[0m"


def ratio_bars(rows: list[tuple[str, float | None, float | None]], *, ref: str = "root", width: int = 40,
               label_w: int = 40) -> list[str]:
    """One line per (label, time ratio, limit), diverging from `│` at 1.0×: a bar to the left is faster, to the
    right slower; `┊` marks the cell's limit. Green faster, yellow slower, red above the limit."""
    dev = [abs(r - 1.0) for _, r, _ in rows if r is not None] + [abs(lim - 1.0) for _, _, lim in rows if lim]
    half = width // 2
    span = max(dev + [0.01]) * 1.05
    out = []
    for label, r, lim in rows:
        name = label if len(label) <= label_w else "…" + label[-(label_w - 1):]
        if r is None:
            out.append(f"{name:<{label_w}} {'—':^{2 * half + 1}}")
            continue
        n = min(half, round(abs(r - 1.0) / span * half))
        left = ("█" * n).rjust(half) if r < 1.0 else " " * half
        right = list(("█" * n).ljust(half) if r > 1.0 else " " * half)
        if lim is not None and lim > 1.0:
            pos = min(half - 1, round((lim - 1.0) / span * half))
            if right[pos] == " ":
                right[pos] = "┊"
        code = "31" if lim is not None and r > lim else ("33" if r > 1.005 else "32")
        flag = "  over its limit" if lim is not None and r > lim else ""
        out.append(f"{name:<{label_w}} {_colour(left, code)}│{_colour(''.join(right), code)} {r:.3f}× {ref}{flag}")
    return out


def stacked_bars(rows: list[tuple[str, dict[str, float]]], *, width: int = 50, label_w: int = 6) -> list[str]:
    """One line per (label, {part: seconds}): the parts side by side, each its own shade, and the total."""
    shades = "█▓▒░"
    top = max((sum(parts.values()) for _, parts in rows), default=0.0) or 1.0
    names = list(dict.fromkeys(k for _, parts in rows for k in parts))
    out = []
    for label, parts in rows:
        bar = "".join(shades[names.index(k) % len(shades)] * round(v / top * width) for k, v in parts.items())
        out.append(f"{label:<{label_w}} {bar:<{width}} {sum(parts.values()):.2f} s")
    out.append(" " * label_w + " " + "  ".join(f"{shades[i % len(shades)]} {n}" for i, n in enumerate(names)))
    return out


@contextlib.contextmanager
def progress(what: str) -> Iterator[Callable[[str], None]]:
    """`tik bench: timing rmsnorm on cuda… 12 s`, rewritten once a second on stderr while the body runs; on a
    terminal only (a log or a pipe gets nothing). Yields `note(text)`, which adds where the work has got to."""
    notes = [""]

    def note(text: str) -> None:
        notes[0] = text

    if not sys.stderr.isatty():
        yield note
        return
    done = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not done.wait(1.0):
            extra = f" ({notes[0]})" if notes[0] else ""
            sys.stderr.write(f"\r\033[K{what}… {time.monotonic() - start:.0f} s{extra}")
            sys.stderr.flush()

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    try:
        yield note
    finally:
        done.set()
        t.join()
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
