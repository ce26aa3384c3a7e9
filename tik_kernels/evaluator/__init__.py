"""The trusted evaluator: runs an implementation file in an isolated child, checks it against its
operator's contract in this process, times it interleaved with the root, incumbent and stock
PyTorch, and decides verified / admissible / eligible (docs/ARCHITECTURE.md, docs/INTERFACES.md).

    from tik_kernels.evaluator import evaluate, EvalReport
    rep = evaluate("rmsnorm", "my_rmsnorm.py")          # -> EvalReport; rep.as_dict() is JSON

The names are loaded lazily: the child (`tik_kernels.evaluator.child`) imports only what it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"evaluate": "core", "source_problem": "core", "EvalReport": "report", "environment": "report"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
