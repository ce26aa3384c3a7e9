"""Inputs written late: how the evaluator catches a kernel that reads its inputs before its dependency wait.

A kernel launched with programmatic dependent launch (PDL, `tik_kernels/ops/_common.py`) may start while the kernel
before it on the stream is still running, and must wait (`griddepcontrol.wait`) before it touches anything that
kernel writes. In a model its inputs *are* the previous kernel's outputs, so a kernel that reads them before its wait
reads stale values there. A probe does not see that by itself: its inputs were copied long before the call, so any
read order gives the right answer, and the timing loop's calls read independent copies too. An operator's `PDL`
tunable is a launch choice the search may move, and a candidate may write any kernel it likes.

So each probe's inputs are written late, as a model's would be: the probe's device copies are first filled with
poison (every byte 0xFF: NaN in floating point, -1 in integers), the device is synchronized, and then one trusted
"writer" kernel per input, each launched with PDL, lets the next kernel launch at once
(`griddepcontrol.launch_dependents`), spins for a while, copies the input's values into place, and waits for the
writer before it (`griddepcontrol.wait`) before it exits. The candidate's call comes next on the stream. A kernel of
it launched with PDL starts while the writers spin; if it reads an input before its own wait it reads poison and its
outputs are wrong, which the checks compare outside the candidate's process. One that waits first sees the last
writer complete, and with it every writer before (each waited for its predecessor), so it reads the values: an
honest candidate's outputs are unchanged. A kernel launched without PDL starts after the last writer as always.

The writers run on few programs (`PROGRAMS`, a quarter of an H100's SMs or fewer) so that most SMs stay free for an
early-launched kernel, and each spins `SPIN` dependent multiply-adds (tens of microseconds) before its copy: long
enough that a kernel started early reaches its first loads before the values arrive. It is a race set up to be
lost by a cheat, not a proof: a kernel that delays its early reads past the spin is not caught, which is why the
spin is far longer than a launch. Nor is it proof against a candidate that rewrites this harness from inside its own
process (the limit `evaluator.child.guard_imports` states): it is there for the kernel that reads too early by mistake,
which in a model reads stale values silently. Nothing here runs without PDL (the CPU, the interpreter, pre-Hopper
GPUs): there no kernel can start before the one before it has finished.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: programs per writer: few, so an early-launched kernel finds free SMs beside them
PROGRAMS = 32
#: dependent fp32 multiply-adds each writer program spins before its copy (about 4 cycles each: ~25 us on an H100)
SPIN = 10000
#: bytes a writer program copies per step
BLOCK = 8192
#: the poison an input holds until its writer copies it in: every byte 0xFF
POISON = 0xFF


@triton.jit
def _late_writer(src_ptr, dst_ptr, sink_ptr, n_bytes, spin, BLOCK: tl.constexpr):
    """Let the next kernel launch, spin, copy `n_bytes` bytes src -> dst, then wait for the kernel before."""
    tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    x = pid.to(tl.float32)
    for _ in range(spin):  # a chain of dependent multiply-adds: the compiler can neither drop nor shorten it
        x = x * 0.9999 + 1.0
    tl.store(sink_ptr + pid, x, mask=x == -1.0)  # never true, but keeps x (and so the spin) live
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


def write_late(pairs: list[tuple[torch.Tensor, torch.Tensor]], spin: int = SPIN) -> None:
    """Copy each (master, copy) pair's values into its poisoned copy, late (the module's docstring): the device
    synchronized first, then one PDL-launched writer per pair on the current stream. Returns at once: the call that
    follows on the stream is what the writers are for."""
    if not pairs:
        return
    device = pairs[0][0].device
    torch.cuda.synchronize(device)
    sink = torch.empty(PROGRAMS, dtype=torch.float32, device=device)
    for master, copy in pairs:
        src, dst = master.view(-1).view(torch.uint8), copy.view(-1).view(torch.uint8)
        n = src.numel()
        grid = (max(1, min(PROGRAMS, triton.cdiv(n, BLOCK))),)
        _late_writer[grid](src, dst, sink, n, spin, BLOCK=BLOCK, num_warps=4, launch_pdl=True)
