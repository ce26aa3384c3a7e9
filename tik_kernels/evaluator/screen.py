"""`screen()`: a quick ranking of several variants of one implementation, before any is evaluated.

The tuner's successive halving (tik_tui/agent/tuner.py) screens a batch of configurations with a
few interleaved rounds per cell, keeps the best, screens those again with more rounds, and sends
only the survivors to the full evaluation. A screen decides nothing: it checks no outputs, and a
variant it ranks first still has to pass the whole contract and beat the incumbent in `evaluate`.

The variants run in one sandboxed child (the timing harness, `timing.py`), interleaved with their
parent, so each variant's objective (Σ coeff · median over the contract's cells, as in
`report.decide`) is compared with the parent's measured in the same rounds. On the GPU the child
gets a copy of the root's compiled kernels (`sandbox.triton_cache`): a variant that moves one tile
bucket compiles only that bucket's kernel.
"""

from __future__ import annotations

import shutil
import statistics
import time

import torch

from tik_kernels.contract import Contract
from tik_kernels.contracts import get_contract
from tik_kernels.evaluator.measure import run_timing
from tik_kernels.evaluator.sandbox import owned_tempdir, policy

#: rounds per cell on the first rung of a screen (the tuner multiplies them on later rungs)
SCREEN_ROUNDS = 6


def _objective(contract: Contract, cells: dict, name: str, profile: str) -> tuple[float | None, dict, str | None]:
    """(Σ coeff · median, {cell: median µs}, error) of implementation `name` in a timing doc's cells."""
    total, per = 0.0, {}
    for cell in contract.cells(profile):
        c = cells[cell.name]
        if "error" in c:
            return None, per, f"{cell.name}: {c['error']}"
        if name in c["errors"]:
            return None, per, f"{cell.name}: {c['errors'][name]}"
        samples = c["samples"].get(name, {}).get("event_us") or []
        if not samples:
            return None, per, f"{cell.name}: no samples"
        per[cell.name] = statistics.median(samples)
        total += cell.coeff * per[cell.name]
    return total, per, None


def screen(op: str | Contract, parent_source: str, sources: list[str], *, device: str | None = None,
           rounds: int = SCREEN_ROUNDS, timeout: float = 120.0, seed: int = 0, profile: str | None = None,
           sandbox: bool | None = None) -> dict:
    """Time each source in `sources` beside `parent_source` for `rounds` rounds per cell, in one child.

    Returns {"failure": None or one line, "rounds", "seconds", "parent_objective", "limits": {cell: the contract's
    admissibility limit}, "results": [{"objective", "speedup" (parent's objective / this one's, >1 is faster),
    "error", "cells": {cell: parent µs / this µs}}]} in the order of `sources`. A variant that fails to import or
    raises in a cell gets an error and no speedup; a child that dies or times out fails the whole screen (the caller
    goes on without it).
    `sandbox` as in `evaluate`.
    """
    contract = op if isinstance(op, Contract) else get_contract(op)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    profile = profile or ("gpu" if device.startswith("cuda") else "cpu")
    t0 = time.monotonic()
    out: dict = {"failure": None, "rounds": rounds, "seconds": None, "parent_objective": None,
                 "limits": {c.name: c.limit for c in contract.cells(profile)},
                 "results": [{"objective": None, "speedup": None, "error": None, "cells": {}} for _ in sources]}
    d = owned_tempdir("tik-screen-")
    try:
        impls = []
        for name, src in [("parent", parent_source)] + [(f"v{i}", s) for i, s in enumerate(sources)]:
            path = d / f"{name}.py"
            path.write_text(src)
            impls.append((name, path))
        with policy(sandbox):
            doc, failure = run_timing(contract, impls, device=device, profile=profile, seed=seed, timeout=timeout,
                                      reps=rounds, fixed_reps=True, baseline=False)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - t0, 2)
    if failure:
        out["failure"] = f"screen: {failure}"
        return out
    errs = doc["import_errors"]
    if "parent" in errs:
        out["failure"] = f"screen: the parent: {errs['parent']}"
        return out
    parent_obj, parent_cells, err = _objective(contract, doc["cells"], "parent", profile)
    if err:
        out["failure"] = f"screen: the parent: {err}"
        return out
    out["parent_objective"] = parent_obj
    for i, r in enumerate(out["results"]):
        name = f"v{i}"
        if name in errs:
            r["error"] = errs[name]
            continue
        obj, per, err = _objective(contract, doc["cells"], name, profile)
        if err:
            r["error"] = err
            continue
        r["objective"] = obj
        r["speedup"] = parent_obj / obj if obj > 0 else None
        r["cells"] = {k: round(parent_cells[k] / v, 4) for k, v in per.items() if v > 0}
    return out
