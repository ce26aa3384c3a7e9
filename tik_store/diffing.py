"""What a derivation changed relative to its parent: line counts (difflib) and the top-level
functions and classes (and their methods) whose source differs (ast)."""

from __future__ import annotations

import ast
import difflib
import functools
import re


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=old_name, tofile=new_name))


def diff_stats(old: str, new: str) -> tuple[int, int]:
    """(lines added, lines removed)."""
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(),
                                                       autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            removed += i2 - i1
        if tag in ("replace", "insert"):
            added += j2 - j1
    return added, removed


def _segments(source: str):
    """`segment(node)`: what `ast.get_source_segment(source, node)` returns, with the source split into lines once
    (the standard function splits the whole source again at every call: 0.12 s per tuner proposal on a 600-line
    root, on the search's critical path). Lines end at \\r\\n, \\r or \\n, never at a form feed, as ast's own
    split; columns are UTF-8 byte offsets."""
    lines, start = [], 0
    for m in re.finditer(r"\r\n|\r|\n", source):
        lines.append(source[start:m.end()])
        start = m.end()
    lines.append(source[start:])

    def segment(node: ast.AST) -> str:
        end = getattr(node, "end_lineno", None)
        if end is None or getattr(node, "end_col_offset", None) is None:
            return ""
        first, last = node.lineno - 1, end - 1
        if first == last:
            return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
        head = lines[first].encode()[node.col_offset:].decode()
        tail = lines[last].encode()[:node.end_col_offset].decode()
        return "".join([head, *lines[first + 1:last], tail])

    return segment


def _definitions(source: str) -> dict[str, str] | None:
    """Qualified name -> source text of every module-level def/class and every method; `<module>`
    holds the remaining module-level statements (constants like CONFIG). None when unparsable.
    A fresh dict each call, from one parse per source text (a search compares every child with its parent,
    the same parent many times)."""
    defs = _parsed_definitions(source)
    return None if defs is None else dict(defs)


@functools.lru_cache(maxsize=16)
def _parsed_definitions(source: str) -> dict[str, str] | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    segment = _segments(source)
    defs: dict[str, str] = {}
    rest: list[str] = []
    for node in tree.body:
        text = segment(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            decorators = "".join(segment(d) for d in node.decorator_list)
            defs[node.name] = decorators + text
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                        defs[f"{node.name}.{sub.name}"] = segment(sub)
        else:
            rest.append(text)
    defs["<module>"] = "\n".join(rest)
    return defs


def functions_changed(old: str, new: str) -> list[str]:
    """Names of definitions added, removed or edited, in the new file's order then removed ones."""
    a, b = _definitions(old), _definitions(new)
    if a is None or b is None:
        return ["<unparsable>"] if old != new else []
    changed = [name for name, text in b.items() if a.get(name) != text]
    changed += [name for name in a if name not in b]
    return changed


def analyse(old: str | None, new: str) -> dict:
    """Diff stats of `new` against `old` (None for a root: everything is added)."""
    old = old or ""
    added, removed = diff_stats(old, new)
    return {"lines_added": added, "lines_removed": removed, "functions_changed": functions_changed(old, new)}
