"""The derivations repository read as plain files, without GitPython: ref names, refs, loose objects.

A reader (`tik log`, `tik show`, `tik status`) needs no more than this, and importing GitPython and
gitdb costs 50-100 ms of a fresh process; `tik_store.gitrepo` (the writer) re-exports these names.
Packed objects are not read here: `read_loose` answers None and the caller asks `GitRepo`.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

META_MARKER = "--- tik-meta ---"
DERIVATION_PREFIX = "refs/derivations/"
PENDING_PREFIX = "refs/pending/"
TAG_PREFIX = "refs/tags/promoted/"


def derivation_ref(impl_id: int) -> str:
    return f"{DERIVATION_PREFIX}{impl_id}"


def promotion_tag(op: str, impl_id: int) -> str:
    """Tag name (without refs/tags/) of a promotion."""
    return f"promoted/{op}/{impl_id}"


def commit_message(summary: str, rationale: str, meta: dict) -> str:
    body = f"\n\n{rationale.strip()}" if rationale.strip() else ""
    return f"{summary}{body}\n\n{META_MARKER}\n{json.dumps(meta, sort_keys=True)}\n"


def parse_meta(message: str) -> dict | None:
    """The JSON metadata a TIK commit or tag carries, or None when there is none."""
    _, sep, tail = message.rpartition(f"\n{META_MARKER}\n")
    if not sep:
        return None
    try:
        meta = json.loads(tail)
    except json.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) else None


def is_repo(path: Path) -> bool:
    return (path / "objects").is_dir() and (path / "HEAD").is_file()


def read_refs(path: Path, prefix: str) -> dict[str, str]:
    """All refs under `prefix` (loose and packed) of the repository at `path` -> hexsha."""
    found: dict[str, str] = {}
    packed = path / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            if line and line[0] not in "#^":
                sha, _, name = line.partition(" ")
                if name.startswith(prefix):
                    found[name] = sha
    base = path / prefix
    if base.is_dir():
        for p in base.rglob("*"):
            if p.is_file() and not p.name.endswith(".lock"):
                sha = p.read_text().strip()
                if len(sha) == 40:
                    found[p.relative_to(path).as_posix()] = sha
    return found


def read_loose(path: Path, hexsha: str) -> bytes | None:
    """A loose object's content (`objects/xx/yyyy`: zlib of `<type> <size>\\0<content>`), or None when
    it is not loose (packed, or missing). A truncated or corrupt object raises ValueError."""
    try:
        raw = (path / "objects" / hexsha[:2] / hexsha[2:]).read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = zlib.decompress(raw)
    except zlib.error as e:
        raise ValueError(f"corrupt git object {hexsha}: {e}") from None
    header, sep, content = data.partition(b"\0")
    size = header.partition(b" ")[2]
    if not sep or not size.isdigit() or int(size) != len(content):
        raise ValueError(f"corrupt git object {hexsha}: bad header {header[:32]!r}")
    return content
