"""Why a derivation has the status it has, in one line, from what its evaluation recorded.

One language of numbers across the UI, the command line and the event log: a ratio is always a
**time ratio** — the candidate's time over a reference's time, measured in the same run, written
`0.950× root` or `1.032× incumbent`. Below 1 is faster. A cell's limit is the same kind of ratio:
`limit 1.05× root` lets that cell be at most 5% slower than the root.

The evaluator's rules (tik_kernels.evaluator.report.decide): *admissible* when verified, every cell
timed and no cell above its limit; *eligible* when admissible and its objective (Σ coeff · median)
is strictly below the incumbent's in the same run. Pure Python: the command line imports it.
"""

from __future__ import annotations


def x(ratio: float | None, ref: str = "") -> str:
    """`0.950× root`; `—` when unknown."""
    if ratio is None:
        return "—"
    return f"{ratio:.3f}×" + (f" {ref}" if ref else "")


def cell_ratio(c: dict) -> float | None:
    """A cell's time over the root's (same run)."""
    r = c.get("ratio_vs_root")
    if r is None and c.get("median_us") is not None and c.get("root_median_us"):
        r = float(c["median_us"]) / float(c["root_median_us"])
    return None if r is None else float(r)


def cell_vs_incumbent(c: dict) -> float | None:
    if c.get("median_us") is None or not c.get("incumbent_median_us"):
        return None
    return float(c["median_us"]) / float(c["incumbent_median_us"])


def cell_limit(c: dict) -> float | None:
    """The highest admissible time ratio to the root (1 + the contract's per-cell limit)."""
    return None if c.get("limit") is None else 1.0 + float(c["limit"])


def over_limit(cells: list[dict]) -> list[tuple[str, float, float]]:
    """(cell, ratio, limit) of every cell above its limit, worst (furthest over) first."""
    out = []
    for c in cells:
        r, lim = cell_ratio(c), cell_limit(c)
        if r is not None and lim is not None and r > lim:
            out.append((str(c.get("cell")), r, lim))
    return sorted(out, key=lambda t: t[1] / t[2], reverse=True)


def objective_ratio(impl: dict) -> float | None:
    """Objective over the incumbent's objective, both from the same run."""
    obj, inc = impl.get("objective"), impl.get("incumbent_objective")
    return float(obj) / float(inc) if obj is not None and inc else None


def explain(impl: dict, cells: list[dict]) -> str:
    """One line: why `impl` (a row with status, failure, objective, incumbent_objective) is what it is."""
    status = impl.get("status")
    if status == "candidate":
        return "not evaluated yet"
    if status == "failed":
        return f"failed: {impl.get('failure') or impl.get('status_detail') or 'no reason recorded'}"
    timed = bool(cells) and all(c.get("median_us") is not None for c in cells)
    over = over_limit(cells)
    vs_inc = objective_ratio(impl)
    if over:
        name, r, lim = over[0]
        more = f" (and {len(over) - 1} more cell{'s' if len(over) > 2 else ''})" if len(over) > 1 else ""
        why = f"not admissible: cell {name} at {x(r, 'root')} > limit {x(lim, 'root')}{more}"
    elif not timed:
        why = "not timed (a CPU search without --time): only timed candidates can become eligible"
    elif vs_inc is not None and vs_inc >= 1.0:
        why = f"not faster than the incumbent: objective {x(vs_inc, 'incumbent')} in the same run"
    elif vs_inc is None and impl.get("parents"):
        why = "no incumbent timing in its run, so no comparison"
    else:
        why = ""
    if status == "verified":
        return why or "verified; the evaluation recorded no reason it is not eligible"
    if status == "eligible":
        return f"eligible: every cell within its limit, objective {x(vs_inc, 'incumbent')}; waits for approval"
    if status == "promoted":
        return "promoted" + (f": objective {x(vs_inc, 'incumbent')} of the incumbent it replaced"
                             if vs_inc is not None and vs_inc < 1.0 else "")
    if status == "rejected":
        return "rejected" + (f"; {why}" if why else "")
    return str(status)
