"""Device evidence for the Claude proposer: compile stats, floor fractions, a draft's quick timing, a profile.

One `DeviceEvidence` per operator and search, built by the loop with the search's device. Everything here runs
in the evaluator's sandboxed children (`tik_kernels.evaluator.evidence`, `tik_kernels.evaluator.screen`), and
is kept per implementation for the search's lifetime: an implementation's source never changes. On the CPU the
answers say what is not available on the interpreter instead of inventing numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

#: cells a draft may be timed on at once, and rounds per cell (interpreter rounds are seconds each)
DRAFT_MAX_CELLS = 6
DRAFT_ROUNDS = {"cuda": 10, "cpu": 1}
INTERPRETER = "not available on the CPU interpreter (no compiled kernels there; timings are interpreter wall times)"


class DeviceEvidence:
    """`ws`: the workspace (sources, measurements); `device`: where evaluations run; `exclusive`: nothing else
    runs on that device while the proposer does (one evaluation slot: the loop proposes only when it is free).
    Without it, no GPU child is started: a compile or a draft's timing would disturb an evaluation's timings."""

    def __init__(self, ws: Any, op: str, device: str, timeout: float = 300.0,
                 screen: Callable[..., dict] | None = None, exclusive: bool = True):
        self.ws, self.op, self.device, self.timeout, self.exclusive = ws, op, device, timeout, exclusive
        self._screen = screen
        self._stats: dict[int, dict] = {}

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def _busy(self) -> dict | None:
        if self.cuda and not self.exclusive:
            return {"error": "not available while evaluations share the GPU (more than one evaluation slot)"}
        return None

    def _contract(self) -> Any:
        from tik_kernels.contracts import get_contract

        return get_contract(self.op)

    def cell_names(self) -> list[str]:
        return [c.name for c in self._contract().cells("gpu" if self.cuda else "cpu")]

    # ------------------------------------------------------------------ compile stats and floors

    def stats(self, impl_id: int) -> dict:
        """Compile stats per kernel variant and work per cell of one implementation (one child, kept)."""
        if not self.cuda:
            return {"error": "compile stats " + INTERPRETER}
        if self._busy():
            return self._busy()
        if impl_id not in self._stats:
            from tik_kernels.evaluator.evidence import compile_evidence

            self._stats[impl_id] = compile_evidence(self.op, self.ws.source(impl_id), device=self.device,
                                                    timeout=self.timeout)
        return self._stats[impl_id]

    def compile_stats(self, impl_id: int) -> dict:
        s = self.stats(impl_id)
        if s.get("error") or s.get("failure"):
            return {"error": s.get("error") or s.get("failure")}
        out: dict = {"kernels": s["kernels"]}
        if s.get("import_error"):
            out["import_error"] = s["import_error"]
        if s.get("errors"):
            out["cell_errors"] = s["errors"]
        return out

    def floors(self, impl_id: int) -> dict:
        """Per measured cell of `impl_id`: achieved GB/s and TFLOP/s, and the fraction of the hardware floor."""
        from tik_kernels.evaluator.evidence import floors

        cells = [c for c in self.ws.measurements(impl_id) if c.get("median_us") is not None]
        if not cells:
            return {"error": f"#{impl_id} has no measurements yet"}
        env = cells[0].get("env") or {}
        if env.get("interpreter") or not self.cuda:
            return {"error": "floor fractions are " + INTERPRETER}
        s = self.stats(impl_id)
        if s.get("error") or s.get("failure"):
            return {"error": s.get("error") or s.get("failure")}
        return {"gpu": env.get("gpu"), "cells": floors(cells, s["work"], env.get("gpu"))}

    # ------------------------------------------------------------------ a draft's timing, a profile

    def time_draft(self, parent_source: str, source: str, cells: list[str] | None = None,
                   rounds: int | None = None) -> dict:
        """`source` timed beside `parent_source` on a few cells in the sandboxed screen (no checks: a speed
        estimate before submitting, never a verdict)."""
        if self._busy():
            return self._busy()
        contract = self._contract()
        profile = "gpu" if self.cuda else "cpu"
        every = {c.name: c for c in contract.cells(profile)}
        names = list(cells or [])
        unknown = [n for n in names if n not in every]
        if unknown:
            return {"error": f"unknown cell(s) {', '.join(unknown[:3])}; cells: {', '.join(list(every)[:12])}"}
        names = names or list(every)[:4]
        if len(names) > DRAFT_MAX_CELLS:
            return {"error": f"at most {DRAFT_MAX_CELLS} cells per draft timing"}
        chosen = [every[n] for n in names]
        sub = dataclasses.replace(contract, cells=lambda _profile: chosen)
        rounds = max(1, min(int(rounds or DRAFT_ROUNDS["cuda" if self.cuda else "cpu"]), 50))
        if self._screen is not None:
            r = self._screen(sub, parent_source, [source], rounds)
        else:
            from tik_kernels.evaluator.screen import screen

            r = screen(sub, parent_source, [source], device=self.device, rounds=rounds, timeout=self.timeout)
        if r.get("failure"):
            return {"error": r["failure"]}
        v = r["results"][0]
        out = {"cells": names, "rounds": rounds, "seconds": r.get("seconds")}
        if v.get("error"):
            out["error"] = v["error"]
            return out
        out["speedup_vs_parent"] = round(v["speedup"], 4) if v.get("speedup") else None
        out["per_cell_speedup"] = v.get("cells")
        if not self.cuda:
            out["note"] = "interpreter wall times: the draft runs, but its speed says nothing about the GPU"
        return out

    def profile(self, impl_id: int, cell: str) -> dict:
        from tik_kernels.evaluator.evidence import ncu_profile

        if self._busy():
            return self._busy()
        return ncu_profile(self.op, self.ws.source(impl_id), cell, device=self.device, timeout=self.timeout)
