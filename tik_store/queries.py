"""Reads of the IR: plain dicts and lists of dicts, JSON-ready."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tik_store.connection import _loads
from tik_store.diffing import unified_diff

#: an implementation's columns in the order of the keys `_impl` gives them (the order `tik log --json` prints);
#: {parents} is the csv of its impl_parents, in position order
_COLUMNS = ("i.id, i.op, i.parent_id, {parents}, i.status, i.status_detail, i.proposer, i.rationale, i.created, "
            "i.updated, i.objective, i.incumbent_objective, i.admissible, i.failure, i.commit_sha, i.filename, "
            "i.source_sha256")
_PARENTS_CSV = ("(SELECT group_concat(parent_id) FROM "
                "(SELECT parent_id FROM impl_parents p WHERE p.impl_id = i.id ORDER BY pos))")
_IMPL = f"SELECT {_COLUMNS.format(parents=_PARENTS_CSV)} FROM implementations i"

_USAGE_SUM = ("count(*) AS calls, coalesce(sum(input_tokens), 0) AS input_tokens, "
              "coalesce(sum(output_tokens), 0) AS output_tokens, coalesce(sum(cache_read_tokens), 0) AS "
              "cache_read_tokens, coalesce(sum(cache_write_tokens), 0) AS cache_write_tokens, "
              "coalesce(sum(cost_usd), 0.0) AS cost_usd")


def _impl(row: tuple, parents: list[int] | None = None) -> dict:
    """An `_IMPL` row as the API shows it; `parents` given, the row's csv is not read."""
    (impl_id, op, parent, csv, status, status_detail, proposer, rationale, created, updated, objective,
     incumbent_objective, admissible, failure, commit, filename, source_sha256) = row
    if parents is None:
        parents = [int(p) for p in csv.split(",")] if csv else []
    return {"id": impl_id, "op": op, "parent": parent, "parents": parents, "status": status,
            "status_detail": status_detail, "proposer": proposer, "rationale": rationale, "created": created,
            "updated": updated, "objective": objective, "incumbent_objective": incumbent_objective,
            "admissible": None if admissible is None else bool(admissible), "failure": failure, "commit": commit,
            "filename": filename, "source_sha256": source_sha256}


class Queries:
    """Mixed into `Workspace`: needs `self.db`, `self._blob`, `self._row`."""

    def operators(self) -> list[dict]:
        rows = list(self.db.query("SELECT * FROM operators ORDER BY created, op"))
        for r in rows:
            r["contract"] = _loads(r["contract"], {})
        return rows

    def implementation(self, impl_id: int) -> dict:
        self._row(impl_id)
        out = _impl(self.db.execute(_IMPL + " WHERE i.id = ?", [impl_id]).fetchone())
        mods = list(self.db.query("SELECT * FROM modifications WHERE impl_id = ?", [impl_id]))
        if mods:
            m = mods[0]
            out["modification"] = {
                "lines_added": m["lines_added"], "lines_removed": m["lines_removed"],
                "functions_changed": _loads(m["functions_changed"], []),
                "expected_effect": _loads(m["expected_effect"], ""),
                "numerical_risks": _loads(m["numerical_risks"], ""), **_loads(m["extra"], {})}
        else:
            out["modification"] = None
        out["usage"] = next(iter(self.db.query(f"SELECT {_USAGE_SUM} FROM llm_usage WHERE impl_id = ?", [impl_id])))
        out["decisions"] = self.decisions(impl_id)
        return out

    def implementations(self, op: str | None = None, status: str | None = None) -> list[dict]:
        return [r for batch in self.iter_implementations(op, status) for r in batch]

    def iter_implementations(self, op: str | None = None, status: str | None = None, *,
                             batch: int = 200) -> Iterator[list[dict]]:
        """`implementations()` in lists of `batch` rows, all from one snapshot. A caller that streams them
        (`tik log --json`) never holds every row: 10,000 rows as dicts are ~30 MB that a fresh process
        pays for in page faults (a fresh `tik log --json` on 10,000 rows: 0.36 s at once, 0.32 s in batches).
        The rows come from one read transaction, held until the iterator is exhausted or closed."""
        where, params = [], []
        if op is not None:
            where.append("i.op = ?")
            params.append(op)
        if status is not None:
            where.append("i.status = ?")
            params.append(status)
        cond = " WHERE " + " AND ".join(where) if where else ""
        # the parents as a second flat query, not _IMPL's per-row subquery (10,000 rows: 50 vs 60 ms),
        # inside one read transaction so both see the same snapshot
        with self.db.atomic() as db:
            parents: dict[int, list[int]] = {}
            for impl_id, parent_id in db.execute(
                    "SELECT p.impl_id, p.parent_id FROM impl_parents p JOIN implementations i ON i.id = p.impl_id"
                    + cond + " ORDER BY p.impl_id, p.pos", params):
                parents.setdefault(impl_id, []).append(parent_id)
            get = parents.get
            cur = db.execute(f"SELECT {_COLUMNS.format(parents='NULL')} FROM implementations i{cond} ORDER BY i.id",
                             params)
            while rows := cur.fetchmany(batch):
                yield [_impl(r, get(r[0], [])) for r in rows]

    def source(self, impl_id: int) -> str:
        return self._blob(self._row(impl_id)["blob_sha"]).decode()

    def diff(self, impl_id: int, against: int | None = None) -> str:
        """Unified diff of `impl_id` against `against` (default: its first parent; a root: the empty file)."""
        row = self._row(impl_id)
        base = against if against is not None else row["parent_id"]
        new = self.source(impl_id)
        if base is None:
            return unified_diff("", new, "/dev/null", f"#{impl_id}/{row['filename']}")
        brow = self._row(base)
        return unified_diff(self.source(base), new, f"#{base}/{brow['filename']}", f"#{impl_id}/{row['filename']}")

    def checks(self, impl_id: int, *, history: bool = False) -> list[dict]:
        """The latest batch of check results (every batch with history=True)."""
        self._row(impl_id)
        sql = "SELECT * FROM checks WHERE impl_id = ?"
        if not history:
            sql += " AND batch = (SELECT max(batch) FROM checks WHERE impl_id = ?)"
        rows = list(self.db.query(sql + " ORDER BY id", [impl_id] if history else [impl_id, impl_id]))
        for r in rows:
            r["passed"] = bool(r["passed"])
        return rows

    def measurements(self, impl_id: int, *, history: bool = False) -> list[dict]:
        """The latest batch of measurements (every batch with history=True); `env` is the fingerprint."""
        self._row(impl_id)
        sql = "SELECT * FROM measurements WHERE impl_id = ?"
        if not history:
            sql += " AND batch = (SELECT max(batch) FROM measurements WHERE impl_id = ?)"
        rows = list(self.db.query(sql + " ORDER BY id", [impl_id] if history else [impl_id, impl_id]))
        for r in rows:
            r["env"] = _loads(r["env"], {})
        return rows

    def evaluations(self, impl_id: int) -> list[dict]:
        rows = list(self.db.query("SELECT * FROM evaluations WHERE impl_id = ? ORDER BY id", [impl_id]))
        for r in rows:
            r["env"] = _loads(r["env"], {})
            for k in ("verified", "admissible", "eligible"):
                r[k] = None if r[k] is None else bool(r[k])
        return rows

    def lineage(self, impl_id: int) -> list[dict]:
        """`impl_id` and its first-parent ancestors, root first."""
        self._row(impl_id)
        sql = ("WITH RECURSIVE anc(id, depth) AS (SELECT ?, 0 UNION ALL "
               "SELECT i.parent_id, anc.depth + 1 FROM implementations i JOIN anc ON i.id = anc.id "
               "WHERE i.parent_id IS NOT NULL) "
               + _IMPL + " JOIN anc ON anc.id = i.id ORDER BY anc.depth DESC")
        return [_impl(r) for r in self.db.execute(sql, [impl_id])]

    def children(self, impl_id: int) -> list[dict]:
        """Implementations with `impl_id` among their parents (merges included)."""
        self._row(impl_id)
        sql = _IMPL + " WHERE i.id IN (SELECT impl_id FROM impl_parents WHERE parent_id = ?) ORDER BY i.id"
        return [_impl(r) for r in self.db.execute(sql, [impl_id])]

    def frontier(self, op: str) -> list[dict]:
        """Verified implementations worth expanding (verified, eligible, promoted), lowest objective first."""
        sql = (_IMPL + " WHERE i.op = ? AND i.status IN ('verified', 'eligible', 'promoted') "
               "ORDER BY i.objective IS NULL, i.objective, i.id")
        return [_impl(r) for r in self.db.execute(sql, [op])]

    def incumbent(self, op: str) -> dict | None:
        """The most recently promoted implementation of `op` (None before any promotion)."""
        sql = (_IMPL + " WHERE i.op = ? AND i.status = 'promoted' ORDER BY "
               "(SELECT max(d.id) FROM decisions d WHERE d.impl_id = i.id AND d.action = 'promote') DESC NULLS LAST, "
               "i.id DESC LIMIT 1")
        row = self.db.execute(sql, [op]).fetchone()
        return None if row is None else _impl(row)

    def root(self, op: str) -> dict | None:
        row = self.db.execute(_IMPL + " WHERE i.op = ? AND i.parent_id IS NULL ORDER BY i.id LIMIT 1", [op]).fetchone()
        return None if row is None else _impl(row)

    def promotion_queue(self) -> list[dict]:
        """Eligible implementations no decision has been made on, oldest first."""
        sql = (_IMPL + " WHERE i.status = 'eligible' AND NOT EXISTS "
               "(SELECT 1 FROM decisions d WHERE d.impl_id = i.id) ORDER BY i.id")
        return [_impl(r) for r in self.db.execute(sql)]

    def attempts(self, op: str, parent: int | None = None) -> list[dict]:
        """Every implementation of `op` (of `parent`'s children when given), failed ones included, each with
        `failed_checks`: the names of the checks its latest evaluation failed."""
        params: list[Any] = [op]
        sql = _IMPL + " WHERE i.op = ?"
        if parent is not None:
            sql += " AND i.id IN (SELECT impl_id FROM impl_parents WHERE parent_id = ?)"
            params.append(parent)
        out = [_impl(r) for r in self.db.execute(sql + " ORDER BY i.id", params)]
        failed: dict[int, list[str]] = {}
        ids = [r["id"] for r in out]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            q = ("SELECT c.impl_id, c.name FROM checks c WHERE c.passed = 0 AND c.impl_id IN "
                 f"({','.join('?' * len(chunk))}) AND c.batch = "
                 "(SELECT max(batch) FROM checks WHERE impl_id = c.impl_id) ORDER BY c.id")
            for r in self.db.query(q, chunk):
                failed.setdefault(r["impl_id"], []).append(r["name"])
        for r in out:
            r["failed_checks"] = failed.get(r["id"], [])
        return out

    def opportunities(self, op: str | None = None) -> list[dict]:
        sql, params = "SELECT * FROM opportunities", []
        if op is not None:
            sql, params = sql + " WHERE op = ?", [op]
        rows = list(self.db.query(sql + " ORDER BY id", params))
        for r in rows:
            r["workloads"] = _loads(r["workloads"], [])
        return rows

    def decisions(self, impl_id: int | None = None) -> list[dict]:
        if impl_id is None:
            return list(self.db.query("SELECT * FROM decisions ORDER BY id"))
        return list(self.db.query("SELECT * FROM decisions WHERE impl_id = ? ORDER BY id", [impl_id]))

    def llm_usage_totals(self) -> dict:
        total = next(iter(self.db.query(f"SELECT {_USAGE_SUM} FROM llm_usage")))
        total["by_model"] = {r.pop("model"): r for r in
                             self.db.query(f"SELECT model, {_USAGE_SUM} FROM llm_usage GROUP BY model ORDER BY model")}
        return total
