"""`doctor()` says what is wrong with a workspace; `reconcile()` repairs what can be repaired without loss.

doctor() checks: the database's integrity and foreign keys; HEAD unmoved and no work tree; every
row's commit exists, has the parents its row says, and is named by `refs/derivations/<id>`;
no derivation ref without a row; no pending ref left by an interrupted write (older than
`in_flight_s`: younger ones belong to a write in progress); a promotion tag for every promoted
row and a promoted row for every tag; each decided row's status matches its last decision; a
worker recorded as running/paused is alive.

reconcile() repairs: a missing or wrong derivation ref (recreated from the row's commit); a
pending ref whose commit has a row (ref set, pending ref dropped); a pending ref whose commit
has no row — a kill between the git write and the DB write — recorded as the row the commit's
metadata describes (nothing is dropped); a promoted row without its tag (tag written); a
promotion tag without its promotion (the decision the tag records is applied); a status that
disagrees with the last decision (set from the decision); a dead worker still marked running
(marked `crashed`). `Workspace.open` itself finishes interrupted writes (`recover_interrupted`:
pending refs only, one directory listing when there are none), so a worker restarting after a
kill starts from a whole IR. Not repairable, only reported: a missing commit object, a commit whose
parents disagree with its row, a ref naming an id with no row, a corrupt database.
Candidates left unevaluated are not a fault: the worker evaluates them first when it resumes.
"""

from __future__ import annotations

import time
from typing import Any

from tik_store.errors import WorkspaceError
from tik_store.gitfiles import (
    DERIVATION_PREFIX,
    PENDING_PREFIX,
    TAG_PREFIX,
    derivation_ref,
    parse_meta,
    promotion_tag,
    read_refs,
)

_DECIDED_STATUS = {"promote": "promoted", "reject": "rejected", "archive": "rejected"}


class Health:
    """Mixed into `Workspace`."""

    def _pending(self, in_flight_s: float) -> dict[str, str]:
        """Pending refs older than `in_flight_s` (younger ones belong to a write in progress)."""
        cutoff = time.time() - in_flight_s
        out = {}
        # plain files (tik_store.gitfiles): a workspace open with nothing to recover never imports GitPython
        for name, sha in read_refs(self.repo_path, PENDING_PREFIX).items():
            p = self.repo_path / name
            if not p.exists() or p.stat().st_mtime <= cutoff:
                out[name] = sha
        return out

    def recover_interrupted(self, *, in_flight_s: float = 60.0) -> list[str]:
        """Finish derivations whose writer died between its git write and its last ref write: a commit with
        no row is recorded from the metadata its message carries; a row without its ref gets it. Cheap
        (one directory listing when there is nothing to do), so `Workspace.open` runs it."""
        done: list[str] = []
        pending = self._pending(in_flight_s)
        if not pending:
            return done
        for name, sha in pending.items():
            rows = list(self.db.query("SELECT id FROM implementations WHERE commit_sha = ?", [sha]))
            row = rows[0] if rows else None
            if row is None:
                info = self.git.commit_info(sha)
                meta = parse_meta(info["message"]) if info else None
                if not meta or not info.get("blob"):
                    continue
                impl_id = self._insert_implementation(meta, sha, info["blob"])
                done.append(f"recorded orphan commit {sha[:12]} as #{impl_id} ({meta['op']}, {meta['proposer']})")
                row = {"id": impl_id}
            if self.git.ref_target(derivation_ref(row["id"])) != sha:
                self.git.set_ref(derivation_ref(row["id"]), sha)
            self.git.delete_ref(name)
            done.append(f"finished interrupted write of #{row['id']} (dropped {name})")
        return done

    def _survey(self, in_flight_s: float) -> dict[str, Any]:
        rows = list(self.db.query("SELECT id, op, commit_sha, parent_id, status FROM implementations ORDER BY id"))
        parents: dict[int, list[int]] = {}
        for r in self.db.query("SELECT impl_id, parent_id FROM impl_parents ORDER BY impl_id, pos"):
            parents.setdefault(r["impl_id"], []).append(r["parent_id"])
        by_id = {r["id"]: r for r in rows}
        by_commit = {r["commit_sha"]: r for r in rows}
        refs = self.git.refs(DERIVATION_PREFIX)
        tags = self.git.refs(TAG_PREFIX)
        pending = self._pending(in_flight_s)
        commit_parents = self.git.commits_info([r["commit_sha"] for r in rows])
        last_decision = {r["impl_id"]: r["action"] for r in self.db.query(
            "SELECT impl_id, action FROM decisions WHERE id IN (SELECT max(id) FROM decisions GROUP BY impl_id)")}
        return {"rows": rows, "parents": parents, "by_id": by_id, "by_commit": by_commit, "refs": refs,
                "tags": tags, "pending": pending, "commit_parents": commit_parents, "last_decision": last_decision}

    def doctor(self, *, in_flight_s: float = 60.0) -> list[str]:
        """Problems, one line each; an empty list when the workspace is healthy."""
        problems: list[str] = []
        db = self.db
        check = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
        if check != ["ok"]:
            problems.append(f"database integrity: {'; '.join(check[:5])}")
        for r in db.execute("PRAGMA foreign_key_check").fetchall()[:20]:
            problems.append(f"database: row {r[1]} of {r[0]} names a missing {r[2]} row")
        head = self.git.head_state()
        if not head.startswith("ref: refs/heads/"):
            problems.append(f"repo HEAD was moved (it is {head!r}); TIK never sets it")
        if (self.git.path / "index").exists():
            problems.append("repo has an index file: something checked out a work tree into the bare repository")
        s = self._survey(in_flight_s)
        for r in s["rows"]:
            i, sha = r["id"], r["commit_sha"]
            got = s["commit_parents"].get(sha)
            if got is None:
                problems.append(f"#{i}: commit {sha[:12]} is missing from the repository")
                continue
            want = [s["by_id"][p]["commit_sha"] for p in s["parents"].get(i, []) if p in s["by_id"]]
            if got != want:
                problems.append(f"#{i}: commit {sha[:12]} has parents {[g[:12] for g in got]}, "
                                f"its parents' commits are {[w[:12] for w in want]}")
            ref = s["refs"].get(derivation_ref(i))
            if ref is None:
                problems.append(f"#{i}: ref {derivation_ref(i)} is missing (commit {sha[:12]})")
            elif ref != sha:
                problems.append(f"#{i}: ref {derivation_ref(i)} points to {ref[:12]}, not {sha[:12]}")
            tag = f"refs/tags/{promotion_tag(r['op'], i)}"
            if r["status"] == "promoted" and tag not in s["tags"]:
                problems.append(f"#{i}: promoted but tag {tag[10:]} is missing")
            decided = s["last_decision"].get(i)
            if decided and r["status"] != _DECIDED_STATUS[decided] and not (decided == "archive"
                                                                               and r["status"] == "failed"):
                problems.append(f"#{i}: status {r['status']} but its last decision was {decided}")
        for name in s["refs"]:
            tail = name[len(DERIVATION_PREFIX):]
            if not tail.isdigit() or int(tail) not in s["by_id"]:
                problems.append(f"ref {name} names no implementation in the database")
        for name, sha in s["pending"].items():
            if sha in s["by_commit"]:
                problems.append(f"interrupted write: {name} left behind for #{s['by_commit'][sha]['id']}")
            else:
                problems.append(f"orphan commit {sha[:12]} ({name}): written to git, never recorded in the database")
        for name in s["tags"]:
            op_id = name[len(TAG_PREFIX):]
            op, _, tail = op_id.rpartition("/")
            row = s["by_id"].get(int(tail)) if tail.isdigit() else None
            if row is None or row["op"] != op:
                problems.append(f"tag {name[10:]} names no {op} implementation")
            elif row["status"] != "promoted":
                problems.append(f"tag {name[10:]} exists but #{row['id']} is {row['status']} (promotion unrecorded)")
        w = self.worker_state()
        if w.get("state") in ("running", "paused") and not w["alive"]:
            age = w["heartbeat_age_s"]
            problems.append(f"worker pid {w.get('pid')} is recorded {w['state']} but is gone "
                            f"(last heartbeat {'never' if age is None else f'{age:.0f} s ago'})")
        return problems

    def reconcile(self, *, in_flight_s: float = 60.0) -> list[str]:
        """Repair what `doctor()` finds and can be repaired without loss; returns the repairs, one line each."""
        done = self.recover_interrupted(in_flight_s=in_flight_s)
        s = self._survey(in_flight_s)
        for r in s["rows"]:
            ref = derivation_ref(r["id"])
            if s["refs"].get(ref) != r["commit_sha"] and s["commit_parents"].get(r["commit_sha"]) is not None:
                self.git.set_ref(ref, r["commit_sha"])
                done.append(f"#{r['id']}: recreated {ref} -> {r['commit_sha'][:12]}")
        for name, sha in s["tags"].items():
            op, _, tail = name[len(TAG_PREFIX):].rpartition("/")
            row = s["by_id"].get(int(tail)) if tail.isdigit() else None
            if row is None or row["op"] != op or row["status"] == "promoted" or row["status"] == "failed":
                continue
            meta = parse_meta(self.git.tag_message(sha) or "") or {}
            try:
                self.decide(row["id"], "promote", by=meta.get("by") or "reconcile", reason=meta.get("reason") or "")
            except WorkspaceError:
                continue
            row["status"] = "promoted"
            s["last_decision"][row["id"]] = "promote"
            done.append(f"#{row['id']}: applied the promotion its tag {name[10:]} records")
        for r in s["rows"]:
            decided = s["last_decision"].get(r["id"])
            if decided and r["status"] != _DECIDED_STATUS[decided] and not (decided == "archive"
                                                                               and r["status"] == "failed"):
                self.set_status(r["id"], _DECIDED_STATUS[decided], f"reconciled with its last decision ({decided})")
                r["status"] = _DECIDED_STATUS[decided]
                done.append(f"#{r['id']}: status set to {r['status']} from its last decision ({decided})")
            tag = f"refs/tags/{promotion_tag(r['op'], r['id'])}"
            if r["status"] == "promoted" and tag not in s["tags"]:
                self.git.write_tag(tag[10:], r["commit_sha"], f"promote #{r['id']} (tag restored by reconcile)\n")
                done.append(f"#{r['id']}: wrote missing tag {tag[10:]}")
        w = self.worker_state()
        if w.get("state") in ("running", "paused") and not w["alive"]:
            self.set_worker_state(state="crashed", heartbeat=w.get("heartbeat") or 0.0,
                                  message=f"marked crashed by reconcile (was {w['state']})")
            done.append(f"worker pid {w.get('pid')} was {w['state']} but gone: marked crashed")
        return done
