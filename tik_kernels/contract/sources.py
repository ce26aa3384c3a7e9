"""The sources a contract reaches: the files a contract's fingerprint hashes."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path

#: the package whose modules a fingerprint follows (everything else is the environment's: torch, triton, ...)
_PACKAGE = "tik_kernels"
_REACHED: dict[tuple, list[Path]] = {}


def _imported_names(tree: ast.AST, package: str) -> set[str]:
    """Every module an import statement in `tree` may load (`from a import b` may load a.b), relative ones
    resolved against `package`, the parent packages included (importing a.b.c runs a and a.b first)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    out = set()
    for n in names:
        parts = n.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return {n for n in out if n == _PACKAGE or n.startswith(_PACKAGE + ".")}


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # `from pkg import function`: pkg.function is no module
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).resolve()


def _module_name(path: Path) -> str:
    """The dotted name of a file inside `tik_kernels` (a file outside it: its stem, it has no package)."""
    root = Path(__file__).resolve().parents[1]  # tik_kernels/
    try:
        rel = path.relative_to(root.parent)
    except ValueError:
        return path.stem
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def reached_sources(starts: Sequence[Path]) -> list[Path]:
    """The source files of `starts` and of every `tik_kernels` module they import, transitively, sorted.
    Kept per start set while no file of it changed (a changed file may import something new)."""
    key = tuple(str(p.resolve()) for p in starts)
    hit = _REACHED.get(key)
    if hit is not None:
        files, stamps = hit
        try:
            if [(f.stat().st_mtime_ns, f.stat().st_size) for f in files] == stamps:
                return files
        except OSError:
            pass
    seen: dict[Path, None] = {}
    todo = [(p.resolve(), None) for p in starts]
    while todo:
        path, name = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        if name is None:
            name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_bytes(), str(path))
        for dep in sorted(_imported_names(tree, package)):
            f = _module_file(dep)
            if f is not None and f not in seen:
                todo.append((f, dep))
    files = sorted(seen, key=str)
    _REACHED[key] = (files, [(f.stat().st_mtime_ns, f.stat().st_size) for f in files])
    return files
