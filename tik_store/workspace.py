"""A TIK workspace: `tik.db` (the IR's rows) + `repo/` (the implementations, as git commits).

Write order, for crash safety: git objects first, then a `refs/pending/<nonce>` ref naming the
commit, then the rows (one transaction), then `refs/derivations/<id>`, then the pending ref
goes. A kill at any point leaves either nothing, or a pending ref `reconcile()` turns into the
row it was meant to be (the commit message carries the row as JSON), or a row whose ref
`reconcile()` recreates. Readers only ever see whole derivations: a row is committed after the
objects it names exist.

Connections: `tik_store.connection` (one per thread, WAL, `BEGIN IMMEDIATE` writes), so a worker
process and any number of viewer processes can share the workspace. The control channel
(events, commands, the worker's state and heartbeat) is `tik_store.channel.Channel`, which a
`Workspace` is, plus the record.

`Workspace.open(path, readonly=True)` is the viewer's open (`tik log | show | status`): its
connections are `query_only`, it leaves repairs to the next writer (`open` without `readonly`,
`tik doctor --repair`, the worker), and it imports GitPython only if a source lives in a pack.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tik_store.channel import Channel
from tik_store.connection import DB_NAME, _j, now
from tik_store.db import Database
from tik_store.diffing import analyse
from tik_store.errors import (
    DamagedWorkspace,
    ReadOnlyWorkspace,
    UnknownImplementation,
    WorkspaceError,
    sqlite_problem,
)
from tik_store.gitfiles import PENDING_PREFIX, commit_message, derivation_ref, is_repo, promotion_tag, read_loose
from tik_store.health import Health
from tik_store.queries import Queries
from tik_store.schema import ACTIONS, SCHEMA, SCHEMA_VERSION, STATUSES

if TYPE_CHECKING:
    from tik_store.gitrepo import GitRepo

REPO_NAME = "repo"
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
OPPORTUNITY_FIELDS = ("mechanism", "workloads", "evidence", "status", "impl_id")


class Workspace(Channel, Queries, Health):
    """The IR store. Use `Workspace.init(path)` / `Workspace.open(path)`, ideally as a context manager."""

    def __init__(self, path: Path, *, readonly: bool = False):
        super().__init__(path, readonly=readonly)
        self.repo_path = self.path / REPO_NAME
        self._git: GitRepo | None = None
        self._git_lock = threading.Lock()

    def _now(self) -> str:
        # this module's clock stamps the channel's rows too (one clock for the whole workspace)
        return now()

    @property
    def git(self) -> GitRepo:
        """The repository's writer (GitPython), opened on first use: reads of rows never need it."""
        with self._git_lock:
            if self._git is None:
                from tik_store.gitrepo import GitRepo

                self._git = GitRepo(self.repo_path, readonly=self.readonly)
            return self._git

    # ------------------------------------------------------------------ opening

    @classmethod
    def init(cls, path: Path | str) -> Workspace:
        path = Path(path)
        if (path / DB_NAME).exists() or (path / REPO_NAME).exists():
            raise WorkspaceError(f"{path} is already a TIK workspace")
        if path.exists() and not path.is_dir():
            raise WorkspaceError(f"{path} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        from tik_store.gitrepo import GitRepo

        GitRepo.init(path / REPO_NAME)
        ws = cls(path)
        conn = ws._conn()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)
        with ws._tx() as db:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?), ('created', ?)", [str(SCHEMA_VERSION), now()])
            db.execute("INSERT INTO worker_state (id, state, updated) VALUES (1, 'idle', ?)", [now()])
        return ws

    @classmethod
    def open(cls, path: Path | str, *, readonly: bool = False) -> Workspace:
        """Open a workspace and finish any write a killed writer left half done (`recover_interrupted`).
        `readonly`: never write (connections are `query_only`) and leave that repair to the next writer."""
        path = Path(path)
        if not (path / DB_NAME).is_file():
            raise WorkspaceError(f"no TIK workspace at {path} (run `tik init`)")
        ws = cls(path, readonly=readonly)
        if not is_repo(ws.repo_path):
            raise WorkspaceError(f"{path} is not a TIK workspace: {REPO_NAME}/ is missing or not a git repository")
        if not readonly and not all(os.access(p, os.W_OK) for p in (path, ws.db_path, ws.repo_path)):
            # said before the first write fails half-way; the viewer's open (`readonly`) still works
            raise ReadOnlyWorkspace(path)
        try:
            row = ws._conn().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as e:
            ws.close()
            if "no such table" in str(e):
                raise WorkspaceError(f"{path} is not a TIK workspace: {DB_NAME} has no TIK tables") from None
            raise sqlite_problem(e, path, ws.db_path) from None
        if row is None or int(row[0]) > SCHEMA_VERSION:
            ws.close()
            raise WorkspaceError(f"{path}: unsupported workspace version {row and row[0]} (this TIK: {SCHEMA_VERSION})")
        if readonly:
            # a half-done write is invisible to a reader: its row is either absent or whole
            return ws
        try:
            ws.recover_interrupted()
        except (sqlite3.OperationalError, OSError):
            pass  # a read-only viewer cannot repair; `tik doctor` still reports it
        return ws

    def close(self) -> None:
        super().close()
        with self._git_lock:
            git, self._git = self._git, None
        if git is not None:
            git.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Workspace({str(self.path)!r})"

    def _blob(self, hexsha: str) -> bytes:
        """A source: read straight from its loose object file (the store writes only those), else from GitPython."""
        try:
            data = read_loose(self.repo_path, hexsha)
            return self.git.read_blob(hexsha) if data is None else data
        except ValueError as e:
            # a truncated or corrupt loose object (a missing one raises DamagedWorkspace in GitRepo)
            raise DamagedWorkspace(f"{e}; `tik doctor` lists the damage") from None

    def _row(self, impl_id: int) -> dict:
        rows = list(self.db.query("SELECT * FROM implementations WHERE id = ?", [impl_id]))
        if not rows:
            raise UnknownImplementation(impl_id)
        return rows[0]

    # ------------------------------------------------------------------ operators, implementations

    def ensure_operator(self, op: str, summary: str = "", contract: dict | None = None,
                        fingerprint: str | None = None) -> None:
        """Create or refresh an operator row; a changed contract fingerprint is recorded as an event."""
        with self._tx() as db:
            old = list(db.query("SELECT fingerprint FROM operators WHERE op = ?", [op]))
            t = now()
            if not old:
                db.execute("INSERT INTO operators VALUES (?, ?, ?, ?, ?, ?)",
                           [op, summary, _j(contract or {}), fingerprint, t, t])
                self._event(db, "operator", {"fingerprint": fingerprint}, op=op)
            else:
                db.execute("UPDATE operators SET summary = ?, contract = ?, fingerprint = ?, updated = ? WHERE op = ?",
                           [summary, _j(contract or {}), fingerprint, t, op])
                if old[0]["fingerprint"] != fingerprint:
                    self._event(db, "operator", {"fingerprint": fingerprint, "was": old[0]["fingerprint"]}, op=op)

    def add_implementation(self, op: str, source: str, *, parents: Iterable[int] = (), proposer: str,
                           rationale: str = "", filename: str | None = None, status: str = "candidate",
                           modification: dict | None = None, usage: dict | list[dict] | None = None) -> int:
        """Record a derivation: a git commit (parent = first parent's commit) and its rows. Returns its id."""
        if status not in STATUSES:
            raise WorkspaceError(f"unknown status {status!r} (one of {', '.join(STATUSES)})")
        parents = [int(p) for p in parents]
        if len(set(parents)) != len(parents):
            raise WorkspaceError(f"duplicate parents {parents}")
        if not list(self.db.query("SELECT op FROM operators WHERE op = ?", [op])):
            raise WorkspaceError(f"unknown operator {op!r} in this workspace")
        prows = [self._row(p) for p in parents]
        for p in prows:
            if p["op"] != op:
                raise WorkspaceError(f"parent #{p['id']} is a {p['op']} implementation, not {op}")
            if p["status"] == "failed":
                raise WorkspaceError(f"parent #{p['id']} failed its contract and cannot be derived from")
        filename = filename or f"{op}.py"
        if "/" in filename or filename in ("", ".", ".."):
            raise WorkspaceError(f"bad implementation file name {filename!r}")
        mod = dict(modification or {})
        stats = analyse(self._blob(prows[0]["blob_sha"]).decode() if prows else None, source)
        usage_list = [usage] if isinstance(usage, dict) else list(usage or [])
        meta = {
            "op": op, "parents": parents, "proposer": proposer, "rationale": rationale, "filename": filename,
            "status": status, "nonce": uuid.uuid4().hex, "created": now(),
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "modification": {**stats, "expected_effect": mod.pop("expected_effect", ""),
                             "numerical_risks": mod.pop("numerical_risks", ""),
                             "extra": {k: v for k, v in mod.items() if k not in stats}},
            "usage": usage_list,
        }
        first = rationale.strip().splitlines()[0][:72] if rationale.strip() else "(no rationale)"
        what = f"from #{parents[0]}" if parents else "root"
        message = commit_message(f"{op} {what} by {proposer}: {first}", rationale, meta)
        commit, blob = self.git.write_commit(filename, source.encode(), [p["commit_sha"] for p in prows], message)
        pending = PENDING_PREFIX + meta["nonce"]
        self.git.set_ref(pending, commit)
        impl_id = self._insert_implementation(meta, commit, blob)
        self.git.set_ref(derivation_ref(impl_id), commit)
        self.git.delete_ref(pending)
        if status == "promoted":
            # recorded promoted outright (a seeded root): keep "every promoted row has its tag" true
            self._ensure_tag(self._row(impl_id), proposer, "recorded as promoted")
        return impl_id

    def _insert_implementation(self, meta: dict, commit: str, blob: str) -> int:
        """The rows of one derivation, in one transaction (idempotent on the nonce)."""
        t = now()
        with self._tx() as db:
            done = list(db.query("SELECT id FROM implementations WHERE nonce = ?", [meta["nonce"]]))
            if done:
                return int(done[0]["id"])
            parents = meta["parents"]
            cur = db.execute(
                "INSERT INTO implementations (op, commit_sha, blob_sha, filename, parent_id, status, proposer, "
                "rationale, source_sha256, nonce, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [meta["op"], commit, blob, meta["filename"], parents[0] if parents else None, meta["status"],
                 meta["proposer"], meta["rationale"], meta["source_sha256"], meta["nonce"], meta["created"], t])
            impl_id = int(cur.lastrowid)
            for pos, p in enumerate(parents):
                db.execute("INSERT INTO impl_parents VALUES (?, ?, ?)", [impl_id, p, pos])
            m = meta["modification"]
            db.execute("INSERT INTO modifications VALUES (?, ?, ?, ?, ?, ?, ?)",
                       [impl_id, m["lines_added"], m["lines_removed"], _j(m["functions_changed"]),
                        _j(m["expected_effect"]), _j(m["numerical_risks"]), _j(m["extra"])])
            for u in meta["usage"]:
                self._insert_usage(db, impl_id, **u)
            self._event(db, "implementation", {"parents": parents, "proposer": meta["proposer"],
                                               "status": meta["status"], "commit": commit}, meta["op"], impl_id)
        return impl_id

    def set_status(self, impl_id: int, status: str, detail: str | None = None) -> None:
        if status not in STATUSES:
            raise WorkspaceError(f"unknown status {status!r} (one of {', '.join(STATUSES)})")
        if status == "promoted":
            self._ensure_tag(self._row(impl_id), "set_status", detail or "")
        with self._tx() as db:
            row = self._row(impl_id)
            db.execute("UPDATE implementations SET status = ?, status_detail = ?, updated = ? WHERE id = ?",
                       [status, detail, now(), impl_id])
            self._event(db, "status", {"from": row["status"], "to": status, "detail": detail}, row["op"], impl_id)

    # ------------------------------------------------------------------ evaluation results

    def _next_batch(self, db: Database, table: str, impl_id: int) -> int:
        return int(db.execute(f"SELECT coalesce(max(batch), 0) + 1 FROM {table} WHERE impl_id = ?",
                              [impl_id]).fetchone()[0])

    def record_checks(self, impl_id: int, checks: list[dict], *, device: str | None,
                      contract_fingerprint: str | None, _evaluation_id: int | None = None) -> None:
        with self._tx() as db:
            self._row(impl_id)
            batch, t = self._next_batch(db, "checks", impl_id), now()
            for c in checks:
                db.execute(
                    "INSERT INTO checks (impl_id, evaluation_id, batch, name, requirement, passed, detail, max_diff, "
                    "device, contract_fingerprint, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [impl_id, _evaluation_id, batch, c["name"], c.get("requirement"), int(bool(c["passed"])),
                     c.get("detail") or "", c.get("max_diff"), device, contract_fingerprint, t])

    def record_measurements(self, impl_id: int, cells: list[dict], *, env: dict,
                            _evaluation_id: int | None = None) -> None:
        with self._tx() as db:
            self._row(impl_id)
            batch, t = self._next_batch(db, "measurements", impl_id), now()
            for c in cells:
                db.execute(
                    'INSERT INTO measurements (impl_id, evaluation_id, batch, cell, device, coeff, "limit", median_us, '
                    "spread_us, samples, root_median_us, incumbent_median_us, baseline_median_us, ratio_vs_root, "
                    "ratio_vs_baseline, gpu, driver, torch, triton, env, created) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [impl_id, _evaluation_id, batch, str(c["cell"]), env.get("device"), c.get("coeff"),
                     c.get("limit"), c.get("median_us"), c.get("spread_us"), c.get("samples"),
                     c.get("root_median_us"), c.get("incumbent_median_us"), c.get("baseline_median_us"),
                     c.get("ratio_vs_root"), c.get("ratio_vs_baseline"), env.get("gpu"), env.get("driver"),
                     env.get("torch"), env.get("triton"), _j(env), t])

    def record_evaluation(self, impl_id: int, report: dict) -> str:
        """Checks + measurements + status from an `EvalReport.as_dict()`, in one transaction.

        Status: not verified -> failed; eligible -> eligible; else verified. A promoted or rejected
        implementation keeps its status (a re-measurement does not undo a decision). Returns the status.
        """
        env = dict(report.get("env") or {})
        with self._tx() as db:
            row = self._row(impl_id)
            cur = db.execute(
                "INSERT INTO evaluations (impl_id, verified, failure, admissible, eligible, objective, "
                "incumbent_objective, device, env, contract_fingerprint, source_sha256, elapsed_s, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [impl_id, int(bool(report.get("verified"))), report.get("failure"), _opt_bool(report.get("admissible")),
                 _opt_bool(report.get("eligible")), report.get("objective"), report.get("incumbent_objective"),
                 env.get("device"), _j(env), report.get("contract_fingerprint"), report.get("source_sha256"),
                 report.get("elapsed_s"), now()])
            ev = int(cur.lastrowid)
            self.record_checks(impl_id, report.get("checks") or [], device=env.get("device"),
                               contract_fingerprint=report.get("contract_fingerprint"), _evaluation_id=ev)
            self.record_measurements(impl_id, report.get("cells") or [], env=env, _evaluation_id=ev)
            if row["status"] in ("promoted", "rejected"):
                status = row["status"]
            elif not report.get("verified"):
                status = "failed"
            else:
                status = "eligible" if report.get("eligible") else "verified"
            db.execute("UPDATE implementations SET status = ?, status_detail = ?, objective = ?, "
                       "incumbent_objective = ?, admissible = ?, failure = ?, updated = ? WHERE id = ?",
                       [status, report.get("failure"), report.get("objective"), report.get("incumbent_objective"),
                        _opt_bool(report.get("admissible")), report.get("failure"), now(), impl_id])
            self._event(db, "evaluation", {
                "verified": bool(report.get("verified")), "eligible": bool(report.get("eligible")),
                "objective": report.get("objective"), "failure": report.get("failure"),
                "from": row["status"], "status": status, "elapsed_s": report.get("elapsed_s"),
                "phases": report.get("phases") or {}}, row["op"], impl_id)
        return status

    # ------------------------------------------------------------------ opportunities, decisions, usage

    def add_opportunity(self, op: str, mechanism: str, *, workloads: Iterable[str] = (), evidence: str = "",
                        status: str = "open") -> int:
        with self._tx() as db:
            t = now()
            cur = db.execute("INSERT INTO opportunities (op, mechanism, workloads, evidence, status, created, updated) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)",
                             [op, mechanism, _j(list(workloads)), evidence, status, t, t])
            oid = int(cur.lastrowid)
            self._event(db, "opportunity", {"id": oid, "mechanism": mechanism, "status": status}, op)
        return oid

    def update_opportunity(self, opportunity_id: int, **fields: Any) -> None:
        bad = set(fields) - set(OPPORTUNITY_FIELDS)
        if bad:
            raise WorkspaceError(f"unknown opportunity field(s) {', '.join(sorted(bad))}")
        if "workloads" in fields:
            fields["workloads"] = _j(list(fields["workloads"]))
        with self._tx() as db:
            rows = list(db.query("SELECT op FROM opportunities WHERE id = ?", [opportunity_id]))
            if not rows:
                raise WorkspaceError(f"no opportunity #{opportunity_id}")
            if fields:
                sets = ", ".join(f"{k} = ?" for k in fields)
                db.execute(f"UPDATE opportunities SET {sets}, updated = ? WHERE id = ?",
                           [*fields.values(), now(), opportunity_id])
            self._event(db, "opportunity", {"id": opportunity_id, **fields}, rows[0]["op"])

    def decide(self, impl_id: int, action: str, *, by: str, reason: str = "") -> int:
        """Record a decision and apply it; returns the decision id.

        promote: status -> promoted, annotated tag `promoted/<op>/<id>` (only a verified, eligible or
        root implementation); reject: status -> rejected; archive: the same status change as reject
        (it leaves the frontier and the queue; a failed one stays failed), recorded as `archive` so
        "not worth expanding" stays distinguishable from "refused by a person". A promoted
        implementation cannot be rejected or archived: it is part of the incumbent history.
        """
        if action not in ACTIONS:
            raise WorkspaceError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
        row = self._row(impl_id)
        is_root = row["parent_id"] is None
        if action == "promote":
            verified = row["status"] in ("verified", "eligible", "promoted")
            promotable = verified or (is_root and row["status"] != "failed")
            if not promotable:
                raise WorkspaceError(f"#{impl_id} is {row['status']}: only a verified implementation can be promoted")
            self._ensure_tag(row, by, reason)
            status = "promoted"
        else:
            if row["status"] == "promoted":
                raise WorkspaceError(f"#{impl_id} is promoted and cannot be {action}ed")
            status = "failed" if row["status"] == "failed" else "rejected"
        with self._tx() as db:
            cur = db.execute("INSERT INTO decisions (impl_id, action, by, reason, created) VALUES (?, ?, ?, ?, ?)",
                             [impl_id, action, by, reason, now()])
            did = int(cur.lastrowid)
            db.execute("UPDATE implementations SET status = ?, updated = ? WHERE id = ?", [status, now(), impl_id])
            self._event(db, "decision", {"action": action, "by": by, "reason": reason, "from": row["status"],
                                         "status": status}, row["op"], impl_id)
        return did

    def _ensure_tag(self, row: dict, by: str, reason: str) -> None:
        """The annotated tag `promoted/<op>/<id>`, written before any row says `promoted`."""
        tag = promotion_tag(row["op"], row["id"])
        if self.git.ref_target(f"refs/tags/{tag}") is None:
            meta = {"action": "promote", "impl_id": row["id"], "op": row["op"], "by": by, "reason": reason,
                    "created": now()}
            self.git.write_tag(tag, row["commit_sha"], commit_message(f"promote #{row['id']} ({by})", reason, meta))

    def _insert_usage(self, db: Database, impl_id: int | None, *, model: str, cost_usd: float = 0.0,
                      **tokens: int) -> int:
        bad = set(tokens) - set(USAGE_FIELDS)
        if bad:
            raise WorkspaceError(f"unknown usage field(s) {', '.join(sorted(bad))}")
        cur = db.execute("INSERT INTO llm_usage (impl_id, model, input_tokens, output_tokens, cache_read_tokens, "
                         "cache_write_tokens, cost_usd, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         [impl_id, model, *(int(tokens.get(k) or 0) for k in USAGE_FIELDS), float(cost_usd or 0),
                          now()])
        return int(cur.lastrowid)

    def record_llm_usage(self, impl_id: int | None, *, model: str, input_tokens: int, output_tokens: int,
                         cache_read_tokens: int = 0, cache_write_tokens: int = 0, cost_usd: float) -> int:
        with self._tx() as db:
            return self._insert_usage(db, impl_id, model=model, cost_usd=cost_usd, input_tokens=input_tokens,
                                      output_tokens=output_tokens, cache_read_tokens=cache_read_tokens,
                                      cache_write_tokens=cache_write_tokens)

def _opt_bool(v: Any) -> int | None:
    return None if v is None else int(bool(v))
