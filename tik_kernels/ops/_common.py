"""Triton helpers the operators share: what is not an operator's to optimise lives here once.

`round_to`: an fp32 value cast to the output dtype, rounded to nearest even in Triton's interpreter too (the interpreter
truncates fp32 -> bf16 casts, the GPU rounds to nearest even), so the CPU tests see the GPU's bits. On the GPU it is a
plain cast.

`pdl_launch` / `pdl_start`: programmatic dependent launch (Hopper and later), an operator's `PDL` tunable. A kernel
launched with it may be scheduled while the kernel before it on the stream is still finishing, so its launch and its
programs' start overlap that kernel's last wave instead of following it: a decode step is ~300 launches of a few
microseconds each, where that gap is a large share. It changes who runs when, never what is computed: the kernel's
first statement (`pdl_start`) waits until the previous kernel has completed and its writes are visible
(`griddepcontrol.wait`), before it reads or writes anything, then lets the next kernel launch early in turn. A kernel
launched without it never executes either instruction (the branch is compiled out), so PDL = 0 is today's kernel.

An operator's own computation stays in its file even where two files compute the same thing (the lm_head logits tile
of logprob, entropy and sample): a candidate is a copy of that one file, and what it may change must be in it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import INTERPRET, pdl_capable  # noqa: F401 (pdl_capable: the operators' import)

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


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """A kernel's first statement: with PDL, wait for the previous kernel on the stream to complete (its writes
    visible), then allow the next one to launch; without, nothing."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch(on, device: torch.device) -> dict:
    """A launch's keywords for PDL: the kernel's PDL constexpr and Triton's launch_pdl option where `on` (an operator's
    CONFIG["PDL"]) and the device can (`pdl_capable`), else none (the kernel as compiled without PDL)."""
    if on and pdl_capable(device):
        return {"PDL": True, "launch_pdl": True}
    return {}


def maxnreg_launch(n: int) -> dict:
    """A launch's keyword capping the kernel's registers a thread at n (Triton's maxnreg; none for 0: the compiler's
    choice). Register allocation moves no bits; it sets how many programs an SM holds at once."""
    return {"maxnreg": n} if n else {}
