"""Exact search/replace edits to an implementation file: how a proposal changes a few lines of a long file.

A three-line change to attention (841 lines, ~10k tokens) as a whole-file submission costs the whole file in
output tokens and risks truncation; as edits it costs the three lines. Each edit's `old` text must occur in the
source exactly once (as it stands after the edits before it); anything else is an `EditError` naming the edit,
which the proposer hands back to the model as a tool error so that it can fix the edit in the same turn.
"""

from __future__ import annotations

import difflib
from typing import Any


class EditError(ValueError):
    """An edit that does not apply (one line, for the model)."""


def _line_of(source: str, pos: int) -> int:
    return source.count("\n", 0, pos) + 1


def _closest(source: str, old: str) -> str:
    """The source line most like the first line of `old`, as a hint."""
    first = next((ln for ln in old.splitlines() if ln.strip()), "")
    lines = source.splitlines()
    match = difflib.get_close_matches(first, lines, n=1, cutoff=0.6)
    if not match:
        return ""
    return f"; closest line {lines.index(match[0]) + 1}: {match[0].strip()[:120]!r}"


def apply_edits(source: str, edits: Any) -> str:
    """`source` with every {"old", "new"} edit of `edits` applied in order."""
    if not isinstance(edits, list) or not edits:
        raise EditError("edits must be a non-empty list of {old, new} objects")
    out = source
    for i, e in enumerate(edits, 1):
        if not isinstance(e, dict) or not isinstance(e.get("old"), str) or not isinstance(e.get("new"), str):
            raise EditError(f"edit {i}: needs string fields old and new")
        old, new = e["old"], e["new"]
        if not old:
            raise EditError(f"edit {i}: old is empty (to rewrite the file, submit it whole)")
        n = out.count(old)
        if n == 0:
            raise EditError(f"edit {i}: old text not found (it must match the current source exactly, "
                            f"whitespace included){_closest(out, old)}")
        if n > 1:
            at, lines, start = [], 0, 0
            while (pos := out.find(old, start)) >= 0 and lines < 5:
                at.append(str(_line_of(out, pos)))
                start, lines = pos + 1, lines + 1
            raise EditError(f"edit {i}: old text occurs {n} times (lines {', '.join(at)}): include more context "
                            "so that it matches once")
        out = out.replace(old, new, 1)
    return out


def changed_lines(before: str, after: str) -> tuple[int, int]:
    """(lines added, lines removed) between two sources."""
    added = removed = 0
    for ln in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0):
        if ln.startswith("+") and not ln.startswith("+++"):
            added += 1
        elif ln.startswith("-") and not ln.startswith("---"):
            removed += 1
    return added, removed
