"""The derivations' git repository, written object by object: no work tree, HEAD never moves.

Each implementation is one commit of a one-file tree; its first parent is the first parent
implementation's commit (a merge has several). The commit message carries the row's metadata
as JSON after a marker line, so a commit whose row was never written (a crash between the two)
can be recorded later without loss. Objects are written and read in-process with gitdb's loose
and packed object databases, and commits and trees are parsed here, so the store never runs the
`git` program: a machine without it (the GPU hosts have none) can hold a workspace, and `git`
itself can still inspect it. GitPython's `Repo` is used only to write refs and to serialize
commits, never to read an object, so it keeps its default object database (the one that would
run `git`, never called; GitPython deprecates the pure-Python one as a `Repo` backend).
Ref names, refs and the commit metadata are plain files (`tik_store.gitfiles`, re-exported here).
GitPython `Repo` objects are not thread-safe: one `Repo` is used under a lock (one thread at a
time), reopened after a fork, and closed by `close()`; the pack database likewise.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# GitPython looks for the `git` program on import and fails without it; nothing here runs it.
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
import git  # noqa: E402
from git.objects import Blob, Commit, Tree  # noqa: E402
from git.objects.fun import tree_to_stream  # noqa: E402
from git.refs.symbolic import SymbolicReference  # noqa: E402
from git.util import Actor  # noqa: E402
from gitdb import IStream, LooseObjectDB  # noqa: E402
from gitdb.db.pack import PackedDB  # noqa: E402
from gitdb.exc import BadObject  # noqa: E402
from gitdb.util import bin_to_hex, hex_to_bin  # noqa: E402

from tik_store.errors import DamagedWorkspace, WorkspaceError  # noqa: E402

# re-exported: the git-free half lives in tik_store.gitfiles, so readers need not import GitPython
from tik_store.gitfiles import (  # noqa: E402, F401
    DERIVATION_PREFIX,
    META_MARKER,
    PENDING_PREFIX,
    TAG_PREFIX,
    commit_message,
    derivation_ref,
    is_repo,
    parse_meta,
    promotion_tag,
    read_refs,
)

_AUTHOR = Actor("tik", "tik@localhost")


class GitRepo:
    """A bare repository at `path`; thread-safe within a process, safe across processes
    (loose objects are written to a temp file and renamed, refs through lock files)."""

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.Lock()
        self._loose = LooseObjectDB(str(self.path / "objects"))
        self._open: git.Repo | None = None
        self._pid = 0
        self._packs: PackedDB | None = None
        self._packs_pid = 0

    @classmethod
    def init(cls, path: Path) -> GitRepo:
        """A new bare repository, laid out as `git init --bare` lays it out."""
        path = Path(path)
        for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags", "info"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        (path / "HEAD").write_text("ref: refs/heads/master\n")
        (path / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n")
        (path / "description").write_text("TIK derivations\n")
        return cls(path)

    def is_repo(self) -> bool:
        return is_repo(self.path)

    @contextmanager
    def _repo(self) -> Iterator[git.Repo]:
        with self._lock:
            if self._open is None or self._pid != os.getpid():
                # opening parses the config (~3 ms): keep one per process, used by one thread at a time
                self._open, self._pid = git.Repo(self.path), os.getpid()
            yield self._open

    def close(self) -> None:
        with self._lock:
            if self._open is not None and self._pid == os.getpid():
                self._open.close()
            self._open = None
            self._packs = None

    # ------------------------------------------------------------------ writes

    def _writable(self) -> None:
        if self.readonly:
            raise WorkspaceError(f"{self.path} was opened read-only")

    def write_commit(self, filename: str, source: bytes, parents: list[str], message: str) -> tuple[str, str]:
        """Write blob, tree and commit; returns (commit hexsha, blob hexsha). Touches no ref."""
        self._writable()
        now = int(time.time())
        with self._repo() as repo:
            blob = self._loose.store(IStream(Blob.type, len(source), io.BytesIO(source)))
            buf = io.BytesIO()
            tree_to_stream([(blob.binsha, 0o100644, filename)], buf.write)
            tree = self._loose.store(IStream(Tree.type, len(buf.getvalue()), io.BytesIO(buf.getvalue())))
            commit = Commit(
                repo, Commit.NULL_BIN_SHA, tree=Tree(repo, tree.binsha),
                author=_AUTHOR, authored_date=now, author_tz_offset=0,
                committer=_AUTHOR, committed_date=now, committer_tz_offset=0,
                message=message, parents=[Commit(repo, hex_to_bin(p)) for p in parents], encoding="UTF-8")
            out = io.BytesIO()
            commit._serialize(out)
            data = out.getvalue()
            stored = self._loose.store(IStream(Commit.type, len(data), io.BytesIO(data)))
        return bin_to_hex(stored.binsha).decode(), bin_to_hex(blob.binsha).decode()

    def write_tag(self, name: str, target: str, message: str) -> str:
        """An annotated tag object for commit `target`, and its ref refs/tags/<name>."""
        self._writable()
        data = (f"object {target}\ntype commit\ntag {name}\n"
                f"tagger {_AUTHOR.name} <{_AUTHOR.email}> {int(time.time())} +0000\n\n{message}").encode()
        with self._repo() as repo:
            tag = self._loose.store(IStream("tag", len(data), io.BytesIO(data)))
            SymbolicReference(repo, f"refs/tags/{name}").set_reference(_Obj(repo, tag.binsha))
        return bin_to_hex(tag.binsha).decode()

    def set_ref(self, ref: str, target: str) -> None:
        self._writable()
        with self._repo() as repo:
            SymbolicReference(repo, ref).set_reference(_Obj(repo, hex_to_bin(target)))

    def delete_ref(self, ref: str) -> None:
        """Remove a ref (loose or packed); a missing one is not an error."""
        self._writable()
        with self._repo() as repo:
            try:
                SymbolicReference.delete(repo, ref)
            except ValueError:
                pass

    # ------------------------------------------------------------------ reads

    def ref_target(self, ref: str) -> str | None:
        """The hexsha a ref names (a tag ref: the tag object), or None."""
        with self._repo() as repo:
            try:
                hexsha, target = SymbolicReference._get_ref_info(repo, ref)
            except ValueError:
                return None
            return hexsha

    def refs(self, prefix: str) -> dict[str, str]:
        """All refs under `prefix` (loose and packed) -> hexsha."""
        return read_refs(self.path, prefix)

    def _stream(self, hexsha: str):
        """An object's gitdb stream (type, size, read()): loose, else from a pack; BadObject when missing."""
        binsha = hex_to_bin(hexsha)
        with self._lock:
            try:
                return self._loose.stream(binsha)
            except BadObject:
                pass
            if self._packs is None or self._packs_pid != os.getpid():
                self._packs, self._packs_pid = PackedDB(str(self.path / "objects" / "pack")), os.getpid()
            return self._packs.stream(binsha)

    def read_object(self, hexsha: str) -> bytes:
        """An object's raw content (loose or packed)."""
        try:
            return self._stream(hexsha).read()
        except BadObject:
            raise DamagedWorkspace(f"git object {hexsha[:12]} is missing from {self.path}; `tik doctor` "
                                   "lists the damage") from None

    def read_blob(self, hexsha: str) -> bytes:
        return self.read_object(hexsha)

    def _commit(self, hexsha: str) -> tuple[str, list[str], str] | None:
        """(tree hexsha, parent hexshas, message) of a commit, or None when it is missing or not a commit."""
        try:
            stream = self._stream(hexsha)
        except (ValueError, BadObject):
            return None
        if stream.type != b"commit" and stream.type != "commit":
            return None
        header, _, message = stream.read().partition(b"\n\n")
        tree, parents, encoding = None, [], "utf-8"
        for line in header.split(b"\n"):
            key, _, value = line.partition(b" ")
            if key == b"tree":
                tree = value.decode()
            elif key == b"parent":
                parents.append(value.decode())
            elif key == b"encoding":
                encoding = value.decode()
        if tree is None:
            return None
        return tree, parents, message.decode(encoding, "replace")

    def _tree_blobs(self, hexsha: str) -> list[tuple[str, str]]:
        """(name, blob hexsha) of a tree's files, in tree order."""
        data = self._stream(hexsha).read()
        out, i = [], 0
        while i < len(data):
            sp = data.index(b" ", i)
            nul = data.index(b"\0", sp)
            mode, name, sha = data[i:sp], data[sp + 1:nul], data[nul + 1:nul + 21]
            if not mode.startswith(b"4") and mode != b"160000":  # not a subtree, not a submodule
                out.append((name.decode("utf-8", "replace"), bin_to_hex(sha).decode()))
            i = nul + 21
        return out

    def commit_info(self, hexsha: str) -> dict | None:
        """{parents, message, blob, filename} of a commit, or None when it is missing."""
        c = self._commit(hexsha)
        if c is None:
            return None
        tree, parents, message = c
        try:
            blobs = self._tree_blobs(tree)
        except (ValueError, BadObject):
            return None
        return {"parents": parents, "message": message,
                "filename": blobs[0][0] if blobs else None, "blob": blobs[0][1] if blobs else None}

    def commits_info(self, hexshas: list[str]) -> dict[str, list[str] | None]:
        """Parent hexshas of many commits (None when a commit is missing)."""
        out: dict[str, list[str] | None] = {}
        for h in hexshas:
            c = self._commit(h)
            out[h] = None if c is None else c[1]
        return out

    def tag_message(self, hexsha: str) -> str | None:
        try:
            return self.read_object(hexsha).decode().partition("\n\n")[2]
        except (ValueError, git.BadObject, git.BadName):
            return None

    def head_state(self) -> str:
        return (self.path / "HEAD").read_text().strip()


class _Obj(git.Object):
    """A git object known only by its sha, for writing refs without reading the object back."""

    type = "commit"

    def __init__(self, repo: git.Repo, binsha: bytes):
        super().__init__(repo, binsha)
