"""Inputs written late: how the evaluator means to catch a kernel that reads its inputs before its dependency wait.

A kernel launched with programmatic dependent launch (PDL, `tik_kernels/ops/_common.py`) may start while the kernel
before it on the stream is still running, and must wait (`griddepcontrol.wait`) before it touches anything that
kernel writes. In a model its inputs *are* the previous kernel's outputs, so a kernel that reads them before its wait
reads stale values there. A probe does not see that by itself: its inputs were copied long before the call, so any
read order gives the right answer, and the timing loop's calls read independent copies too. An operator's `PDL`
tunable is a launch choice the search may move, and a candidate may write any kernel it likes.

So each probe's inputs can be written late, as a model's would be: the probe's device copies are first filled with
poison (every byte 0xFF: NaN in floating point, -1 in integers), the device is synchronized, and then one trusted
"writer" kernel per input, each launched with PDL, lets the next kernel launch at once
(`griddepcontrol.launch_dependents`) and holds its copy back until the host has made the probe's call (the release,
a one-word store from a second stream once the call has returned: every kernel of the call is launched by then), then
copies the input's values into place and waits for the writer before it (`griddepcontrol.wait`) before it exits. A
kernel of the call launched with PDL may start while the writers hold; if it reads an input before its own wait it
reads poison and its outputs are wrong, which the checks compare outside the candidate's process. One that waits first
sees the last writer complete, and with it every writer before (each waited for its predecessor), so it reads the
values: an honest candidate's outputs are unchanged. A kernel launched without PDL starts after the last writer as
always. A call that waits for the GPU itself (`.item()`, a synchronize) before it returns cannot be released first:
the writers stop holding after `HOLD_POLLS` polls of the release word (a few milliseconds) instead of deadlocking.

A first version held the copy for a fixed ~25 us spin; on an H100 it caught nothing (benchmarks/results/
pytest_gpu_h100_s21_late_spin.log): the host's own launches of the writers and of the call took longer than the spin,
so the planted early reader's kernel started after the values were in place. The release ties the hold to the call
instead of to a guess of the host's speed. The writers run on few programs (`PROGRAMS`) so that most SMs stay free
for an early-launched kernel. It is a race set up for a mistaken kernel to lose, not a proof: nor is it proof against
a candidate that rewrites this harness from inside its own process (the limit `evaluator.child.guard_imports`
states). Nothing here runs without PDL (the CPU, the interpreter, pre-Hopper GPUs): there no kernel can start before
the one before it has finished. On by default since session 22, where the GPU tests showed it works (an H100,
benchmarks/results/pytest_gpu_h100_s22_late*.log): the planted early reader fails, the one that waits passes, every
library root stays verified and every other evaluator GPU test passes with it, except that the lazy candidate
(`fixtures/lazy_gpu.py`, which returns a stale output whenever the stream is busy at its call) is now caught by the
probes, whose calls always find the writers holding, before its timing can be. `TIK_LATE_INPUTS=0` turns it off.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

#: programs per writer: few, so an early-launched kernel finds free SMs beside them
PROGRAMS = 32
#: polls of the release word a writer makes at most before it copies anyway (each a volatile global load, ~1 us)
HOLD_POLLS = 4000
#: bytes a writer program copies per step
BLOCK = 8192
#: the poison an input holds until its writer copies it in: every byte 0xFF
POISON = 0xFF
#: the switch: late inputs unless TIK_LATE_INPUTS=0
ENV = "TIK_LATE_INPUTS"


def active(device: str) -> bool:
    """Probes on `device` get their inputs late: a device with PDL (elsewhere no kernel can start before the one
    before it has finished), unless `TIK_LATE_INPUTS=0`."""
    if os.environ.get(ENV, "1") == "0" or not str(device).startswith("cuda"):
        return False
    from tik_kernels._runtime import pdl_capable

    return pdl_capable(torch.device(device))


@triton.jit
def _late_writer(src_ptr, dst_ptr, release_ptr, n_bytes, hold_polls, BLOCK: tl.constexpr):
    """Let the next kernel launch, hold until released (or `hold_polls` polls), copy `n_bytes` bytes src -> dst,
    then wait for the kernel before."""
    tl.extra.cuda.gdc_launch_dependents()
    polls = 0
    while (tl.load(release_ptr, volatile=True) == 0) & (polls < hold_polls):
        polls += 1
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid.to(tl.int64) * BLOCK, n_bytes, nprog * BLOCK):
        o = start + tl.arange(0, BLOCK).to(tl.int64)
        m = o < n_bytes
        tl.store(dst_ptr + o, tl.load(src_ptr + o, mask=m), mask=m)
    tl.extra.cuda.gdc_wait()


def lateable(master: torch.Tensor) -> bool:
    """A device copy that can be written late: contiguous (its bytes are one span, as its copy's), on a GPU."""
    return master.device.type == "cuda" and master.is_contiguous() and master.numel() > 0


def poisoned_like(master: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with `master`'s shape, dtype and strides, every byte POISON."""
    t = torch.empty_like(master, memory_format=torch.contiguous_format)
    t.view(-1).view(torch.uint8).fill_(POISON)
    return t


def write_late(pairs: list[tuple[torch.Tensor, torch.Tensor]], hold_polls: int = HOLD_POLLS):
    """Copy each (master, copy) pair's values into its poisoned copy, late (the module's docstring): the device
    synchronized first, then one PDL-launched writer per pair on the current stream, each holding until released.
    Returns the release: call it once the probe's call has returned (it stores the word the writers poll, from a
    second stream, so it does not queue behind them)."""
    if not pairs:
        return lambda: None
    device = pairs[0][0].device
    word = torch.zeros(1, dtype=torch.int32, device=device)
    torch.cuda.synchronize(device)
    for master, copy in pairs:
        src, dst = master.view(-1).view(torch.uint8), copy.view(-1).view(torch.uint8)
        n = src.numel()
        grid = (max(1, min(PROGRAMS, triton.cdiv(n, BLOCK))),)
        _late_writer[grid](src, dst, word, n, hold_polls, BLOCK=BLOCK, num_warps=4, launch_pdl=True)
    side = torch.cuda.Stream(device)

    def release() -> None:
        with torch.cuda.stream(side):
            word.fill_(1)
        word.record_stream(side)  # its memory is not handed out again before the side stream's store has run
        torch.cuda.current_stream(device).wait_stream(side)  # and the call's stream goes on after that store

    return release
