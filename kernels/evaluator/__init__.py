"""The trusted evaluator: runs an implementation file in an isolated child, checks it against its
operator's contract in this process, times it interleaved with the root, incumbent and stock
PyTorch, and decides verified / admissible / eligible (DESIGN.md, docs/INTERFACES.md).

    from kernels.evaluator import evaluate, EvalReport
    rep = evaluate("rmsnorm", "my_rmsnorm.py")          # -> EvalReport; rep.as_dict() is JSON
"""

from kernels.evaluator.core import evaluate, source_problem
from kernels.evaluator.report import EvalReport, environment

__all__ = ["EvalReport", "environment", "evaluate", "source_problem"]
