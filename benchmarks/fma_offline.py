"""Where the compiler fuses a multiply and an add into an FMA in the decode step's and the lm_head's kernels.

    PYTHONPATH=. python benchmarks/fma_offline.py > benchmarks/results/fma_offline.txt

Every operator but attention compiles with fp contraction on, so LLVM may turn `a * b + c` into one FMA (one rounding
instead of two). Where a sum has a single product that is no choice; where it has two (`a * b + c * d`) LLVM picks which
one to fuse from the code around it, and two kernels that must give the same bits can disagree (session 26: rope's
rotation and its copy in the one-launch q / k norms + rope). Each kernel is compiled for sm_90 on this machine (no
GPU), as `ptx_unchanged.py` compiles it, with contraction on and off: the FMAs the first has beyond the second are the
ones the compiler chose; the rest are written out (`tl.fma`) or inside library functions (libdevice's sin and cos).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lmhead_ptx_offline  # noqa: E402
import offline_compile as oc  # noqa: E402
import ptx_unchanged  # noqa: E402


def fmas(op: str, kernel: str, const: dict, types: dict, opts: dict, fusion: bool) -> int:
    ptx = ptx_unchanged.ptx(oc.op_path(op), kernel, const, types, {**opts, "enable_fp_fusion": fusion})
    return ptx.count("fma.rn.f32")


def main() -> int:
    import triton

    print(f"sm_90 PTX, Triton {triton.__version__}: fma.rn.f32 with fp contraction on / off (attention launches with "
          "it off; the others with it on)")
    cases = list(ptx_unchanged.CASES) + [(op, k, c, t, {"num_warps": 8, "num_stages": 3})
                                         for op, k, c, t in lmhead_ptx_offline.CASES]
    for op, kernel, const, types, opts in cases:
        on, off = (fmas(op, kernel, const, types, opts, f) for f in (True, False))
        print(f"{op:12s} {kernel:34s} on {on:4d}  off {off:4d}  chosen by the compiler {on - off:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
