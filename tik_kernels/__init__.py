"""TIK's operator library: unified, bitwise-consistent kernels, their contracts and the evaluator.

`tik_kernels.ops.<op>` are the root implementation files (what derivations replace, whole);
`tik_kernels.reference`, `tik_kernels.contracts` and `tik_kernels.evaluator` are frozen, trusted code.
"""

from tik_kernels._runtime import DEVICE, HAS_GPU, INTERPRET

__all__ = ["DEVICE", "HAS_GPU", "INTERPRET"]
