"""A spy on a module's Triton kernel: every launch still runs, and `record(args, kwargs)` of each is kept in order.

    seen = spy_launches(monkeypatch, attention, "_attn_decode_kernel", lambda args, kwargs: kwargs.get("maxnreg"))

What the host code passed a launch (a register cap, a scratch's dtype) is then checked beside the launch's bits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def spy_launches(monkeypatch, module, kernel: str, record: Callable[[tuple, dict], Any]) -> list:
    """Replace `module.<kernel>` (for the test) with a launcher that records each launch and runs the real one."""
    real, seen = getattr(module, kernel), []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(record(args, kwargs))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(module, kernel, Spy())
    return seen
