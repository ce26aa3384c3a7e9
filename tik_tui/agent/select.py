"""Which verified implementation to expand next, read from the IR.

Every frontier node (verified, eligible or promoted; never a failed one) is scored by how
good it is and how little it has been explored:

    score = -log(quality) + C * sqrt(log(1 + N) / (1 + n))  - FAIL * failures  + OPP * targets  - OVER * excess

quality is the coefficient-weighted mean of its per-cell ratios to the root (1.0 when it has
no timings, e.g. on the CPU interpreter), n the derivations already made from it, N all of
them for the operator, failures the failed ones among its n, and targets 1 when an open
opportunity names a cell on which it is still slower than the root; excess is log(ratio / (1 + limit)) of its
cell furthest past its admissibility limit (0 when none is), so a node no derivation can make admissible
without undoing it is not expanded ahead of those that are. So verified non-best
intermediates keep being expanded (branches, not only the incumbent) until they stop paying.
With `explore=False` (the greedy ablation) the parent is always the incumbent (else the root).
A merge partner is offered for proposers that can merge: another verified node that is not
its ancestor or descendant and that no earlier merge combined with it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

#: exploration weight, failure penalty, opportunity bonus, weight of a cell past its limit
C, FAIL, OPP, OVER = 0.5, 0.05, 0.1, 2.0
#: how often a merge is offered when one is possible
MERGE_RATE = 0.25


@dataclass
class Selection:
    parent: dict
    merge_with: dict | None = None
    reason: str = ""


def quality(cells: list[dict]) -> float:
    """Coefficient-weighted mean ratio to the root over the cells that have one (1.0 when none do)."""
    num = den = 0.0
    for c in cells or []:
        r = c.get("ratio_vs_root")
        if r is None or not math.isfinite(r) or r <= 0:
            continue
        w = float(c.get("coeff") or 1.0)
        num, den = num + w * r, den + w
    return num / den if den else 1.0


def excess(cells: list[dict]) -> float:
    """log(ratio / (1 + limit)) of the cell furthest past its admissibility limit; 0 when every cell is within."""
    worst = 0.0
    for c in cells or []:
        r, lim = c.get("ratio_vs_root"), c.get("limit")
        if isinstance(r, (int, float)) and isinstance(lim, (int, float)) and math.isfinite(r) and r > 0:
            worst = max(worst, math.log(r / (1.0 + lim)))
    return worst


def _slow_cells(cells: list[dict]) -> set[str]:
    return {c.get("cell") for c in cells or [] if (c.get("ratio_vs_root") or 0) > 1.0}


def _ancestors(store: Any, impl_id: int) -> set[int]:
    return {row["id"] for row in store.lineage(impl_id)}


def select_parent(store: Any, op: str, *, explore: bool = True, exclude: set[int] | frozenset = frozenset(),
                  can_merge: bool = False, rng: random.Random | None = None) -> Selection | None:
    rng = rng or random.Random(0)
    frontier = [f for f in store.frontier(op) if f["id"] not in exclude]
    if not explore:
        best = store.incumbent(op) or store.root(op)
        if best is None or best["id"] in exclude:
            return None
        return Selection(best, reason="greedy: the incumbent")
    if not frontier:
        return None
    attempts = store.attempts(op)
    total = len(attempts)
    by_parent: dict[int, list[dict]] = {}
    for a in attempts:
        for p in _parents(a):
            by_parent.setdefault(p, []).append(a)
    open_targets = set()
    for o in store.opportunities(op):
        if o.get("status", "open") == "open":
            open_targets |= set(o.get("workloads") or ())
    scored = []
    for f in frontier:
        cells = store.measurements(f["id"])
        tried = by_parent.get(f["id"], [])
        failures = sum(1 for a in tried if a.get("status") == "failed")
        q = quality(cells)
        score = (-math.log(q) + C * math.sqrt(math.log(1 + total) / (1 + len(tried))) - FAIL * failures
                 - OVER * excess(cells))
        if open_targets & _slow_cells(cells):
            score += OPP
        scored.append((score, rng.random(), f, q, len(tried)))
    scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
    score, _, parent, q, n = scored[0]
    sel = Selection(parent, reason=f"score {score:.3f}: {q:.3f}× root per cell, {n} attempts from it")
    if can_merge and len(frontier) > 1 and rng.random() < MERGE_RATE:
        partner = _merge_partner(store, parent, frontier, attempts)
        if partner is not None:
            sel.merge_with = partner
            sel.reason += f"; merge with #{partner['id']}"
    return sel


def _parents(row: dict) -> list[int]:
    ps = row.get("parents")
    if isinstance(ps, (list, tuple)) and ps:
        return [int(p["id"] if isinstance(p, dict) else p) for p in ps]
    return [row["parent_id"]] if row.get("parent_id") is not None else []


def _merge_partner(store: Any, parent: dict, frontier: list[dict], attempts: list[dict]) -> dict | None:
    lineage = _ancestors(store, parent["id"])
    merged = {frozenset(_parents(a)) for a in attempts if len(_parents(a)) > 1}
    for f in frontier:
        if f["id"] == parent["id"] or f["id"] in lineage:
            continue
        if parent["id"] in _ancestors(store, f["id"]):
            continue
        if frozenset((parent["id"], f["id"])) in merged:
            continue
        return f
    return None


def choose(store: Any, op: str, proposer: Any, *, explore: bool = True, exclude: set[int] | frozenset = frozenset(),
           rng: random.Random | None = None) -> Selection | None:
    """The step's parent (and merge partner): the proposer's own request when it makes one
    (`preferred_parent(op, store) -> (parent id, merge id)`), else `select_parent`."""
    pref = getattr(proposer, "preferred_parent", None)
    if pref is not None:
        pid, mid = pref(op, store)
        if pid is not None:
            return Selection(store.implementation(pid), store.implementation(mid) if mid is not None else None,
                             "requested")
    return select_parent(store, op, explore=explore, exclude=exclude,
                         can_merge=bool(getattr(proposer, "supports_merge", False)), rng=rng)
