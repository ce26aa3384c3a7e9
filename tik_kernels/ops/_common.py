"""Triton helpers the operators share: what is not an operator's to optimise lives here once.

`round_to`: an fp32 value cast to the output dtype, rounded to nearest even in Triton's interpreter too (the interpreter
truncates fp32 -> bf16 casts, the GPU rounds to nearest even), so the CPU tests see the GPU's bits. On the GPU it is a
plain cast.

An operator's own computation stays in its file even where two files compute the same thing (the lm_head logits tile
of logprob, entropy and sample): a candidate is a copy of that one file, and what it may change must be in it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET

#: Triton's interpreter truncates fp32 -> bf16 casts (the GPU rounds to nearest even): round by hand there
_INTERPRET = tl.constexpr(INTERPRET)


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """x (fp32) cast to DTYPE, round-to-nearest-even on the GPU and in the interpreter alike."""
    if _INTERPRET and DTYPE == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(DTYPE)
