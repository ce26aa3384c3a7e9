"""TIK's operator library: unified, bitwise-consistent kernels, their contracts and the evaluator.

`kernels.ops.<op>` are the root implementation files (what derivations replace, whole);
`kernels.reference`, `kernels.contracts` and `kernels.evaluator` are frozen, trusted code.
"""

from kernels._runtime import DEVICE, HAS_GPU, INTERPRET

__all__ = ["DEVICE", "HAS_GPU", "INTERPRET"]
