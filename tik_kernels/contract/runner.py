"""Running probes: importing an implementation file by path, calling a probe's entry point on a device,
and running a whole plan in this process (`run_plan`, for trusted implementations: the library's tests).
The evaluator's child runs the same `execute_probe` across a process boundary."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tik_kernels.contract import late as L
from tik_kernels.contract.model import CheckResult, Plan, Probe, ProbeResult, Results


def flatten_outputs(value: Any) -> list[torch.Tensor]:
    """An entry point's return value as a list of plain dense tensors; anything else is an error."""
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    out = []
    for i, t in enumerate(items):
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise TypeError(f"output {i} is {type(t).__name__}, not a plain torch.Tensor")
        if t.layout != torch.strided:
            raise TypeError(f"output {i} has layout {t.layout}, not strided")
        if t.is_meta:
            raise TypeError(f"output {i} is a meta tensor")
        out.append(t)
    return out


class Staged:
    """Device copies of a probe set's inputs, made once: a tensor argument shared by many probes (linear's weight is
    in 12 of its 64 probes: 8.2 GB moved to the GPU per pass, 1.9 GB of it distinct) is moved from the host once, and
    each probe gets a fresh device-to-device copy of it (a new address, as before). `master(cpu)` is the copy the
    probes' copies are made from, never handed to a call: inputs echoed after a call are compared with it on the
    device (`evaluator.child`)."""

    def __init__(self, device: str):
        self.device = device
        self._masters: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(host tensor) -> (host, device copy)
        #: the inputs of the call being prepared that are to be written late, (master, poisoned copy) pairs; None
        #: where probes get no late inputs (`late.active`)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if L.active(device) else None

    def master(self, v: torch.Tensor) -> torch.Tensor:
        hit = self._masters.get(id(v))
        if hit is None or hit[0] is not v:
            hit = (v, v.detach().to(self.device, copy=True))
            self._masters[id(v)] = hit
        return hit[1]

    def drop(self) -> None:
        self._masters.clear()

    def copy(self, v: torch.Tensor, late: bool = False) -> torch.Tensor:
        """A fresh device copy of `v` (strides as the master's, which are as `v.to(device, copy=True)` makes them).
        `late`, where late inputs are on (`late.active`): a poisoned tensor whose values the next `write_pending`
        writes late."""
        master = self.master(v)
        if late and self.pending is not None:
            if L.lateable(master):
                t = L.poisoned_like(master)
                self.pending.append((master, t))
                return t
        return master.clone()

    def write_pending(self):
        """The late inputs of the call about to be made, written late on the current stream (`late.write_late`);
        returns their release, to call once the call has returned."""
        pairs, self.pending = self.pending or [], ([] if self.pending is not None else None)
        return L.write_late(pairs)


def _to_device(v: Any, device: str, requires_grad: bool = False, values: bool = True,
               staged: Staged | None = None, late: bool = False) -> Any:
    """A device copy of a tensor argument (others as they are). values=False: a floating-point tensor is allocated
    with the shape, dtype and strides its copy would have, but not copied (`call_probe`'s dry run: a copy keeps the
    strides of a dense tensor and makes any other contiguous, and so does `empty_like`; the dry run must ask Triton
    for the specialisations the real call will); integer tensors are always copied (host code may size grids from
    them). `staged`: copied from its device master instead of from the host; `late` with it: written late, just
    before the call (`Staged.copy`)."""
    if isinstance(v, torch.Tensor):
        if not values and v.is_floating_point():
            t = torch.empty_like(v, device=device)
        elif staged is not None:
            t = staged.copy(v, late=late)
        else:
            t = v.detach().to(device, copy=True)
        if requires_grad:
            t.requires_grad_(True)
        return t
    return v


def call_probe(module: ModuleType, probe: Probe, device: str, values: bool = True,
               staged: Staged | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One probe's call on fresh device copies of its inputs: (outputs, then the gradients of its grad
    arguments when it has any; the device copies of its tensor arguments, as the call left them). Raises what
    the call raises. values=False is a dry run for what the call launches, not what it computes: floating-point
    inputs (and gradients in) are uninitialised tensors of the same shape, strides and dtype, not copies
    (`evaluator.ahead`: 1.9 GB of linear's probes not moved again). `staged`: the copies are made on the device
    from `Staged` masters (`Staged`), and, where PDL exists (unless `TIK_LATE_INPUTS=0`), written late, so a kernel that
    reads its inputs before its dependency wait computes from poison (`tik_kernels/contract/late.py`)."""
    fn = getattr(module, probe.entry, None)
    if not callable(fn):
        raise LookupError(f"entry point {probe.entry}() missing")
    late = values and staged is not None
    if late and staged.pending:
        staged.pending = []  # pairs left by a call that failed before its writers ran: their copies are gone
    args = tuple(_to_device(a, device, i in probe.grad_args, values, staged, late) for i, a in enumerate(probe.args))
    kwargs = {k: _to_device(v, device, values=values, staged=staged, late=late) for k, v in probe.kwargs.items()}
    release = staged.write_pending() if late else None  # the values arrive once the call has launched its kernels
    with torch.set_grad_enabled(bool(probe.grad_args)):
        try:
            outs = fn(*args, **kwargs)
        finally:
            if release is not None:
                release()
        outs = flatten_outputs(outs)
        if probe.grad_args:
            gos = probe.grad_outputs or tuple(torch.ones_like(o) for o in outs)
            pairs = [(o, g) for o, g in zip(outs, gos, strict=False) if g is not None and o.requires_grad]
            if not pairs:
                raise RuntimeError("outputs do not require grad: no backward")
            torch.autograd.backward([o for o, _ in pairs],
                                    [_to_device(g, device, values=values, staged=staged) for _, g in pairs])
            grads = []
            for i in probe.grad_args:
                g = args[i].grad
                grads.append(g if g is not None else torch.zeros_like(args[i]))
            outs = [o.detach() for o in outs] + grads
    return outs, [a for a in args if isinstance(a, torch.Tensor)]


def execute_probe(module: ModuleType, probe: Probe, device: str, staged: Staged | None = None) -> ProbeResult:
    """Run one probe on `module` and return CPU copies of its outputs. Used in-process and by the child.
    `staged`: inputs are copied from its device masters, and the outputs and the echoed inputs (`inputs_after`)
    are left on the device, detached: the child copies each output once, straight into its reply's pages
    (`protocol.TensorWriter`), right after this returns (a copy to fresh CPU memory first, then into the reply,
    was two copies of linear's 3 GB)."""
    if not callable(getattr(module, probe.entry, None)):
        return ProbeResult(error=f"entry point {probe.entry}() missing")
    # a fresh allocation of random size first, so tensor addresses differ run to run
    pad = torch.empty(random.randint(1, 4096) * 64, dtype=torch.uint8, device=device)
    try:
        outs, args = call_probe(module, probe, device, staged=staged)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        result = ProbeResult(outputs=[o.detach() if staged is not None else o.detach().to("cpu", copy=True)
                                      for o in outs])
        if probe.echo_inputs:
            result.inputs_after = [a.detach() if staged is not None else a.detach().to("cpu", copy=True)
                                   for a in args]
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result = ProbeResult(error=f"{type(e).__name__}: {msg}"[:300])
    del pad
    return result


def run_probes(module: ModuleType, probes: Sequence[Probe], device: str) -> dict[str, ProbeResult]:
    return {p.id: execute_probe(module, p, device) for p in probes}


def load_module(path: str | Path, name: str = "tik_candidate") -> ModuleType:
    """Import an implementation file by path (a fresh module object each call)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    # registered only while its body runs: dataclasses (Python 3.12) looks a class's string annotations
    # up through sys.modules[cls.__module__] and failed on an unregistered module (every linear timing
    # run on the H200 died in contracts/linear.py's dataclass). Left registered, a later load under the
    # same name would replace an earlier one that Triton's interpreter still resolves through it.
    previous = sys.modules.get(name)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    return mod


def run_plan(
    plan: Plan,
    module: ModuleType,
    root_module: ModuleType | None = None,
    device: str | None = None,
) -> list[CheckResult]:
    """Run a plan in this process (trusted implementations only: the library's tests use this)."""
    from tik_kernels._runtime import DEVICE

    device = device or DEVICE
    cand = run_probes(module, plan.probes, device)
    root = None
    if plan.needs_root:
        root = run_probes(root_module or module, plan.probes, device) if root_module is not None else None
    return evaluate_checks(plan, cand, root)


def evaluate_checks(
    plan: Plan, cand: Mapping[str, ProbeResult], root: Mapping[str, ProbeResult] | None
) -> list[CheckResult]:
    res = Results(cand, root)
    return [c.run(res) for c in plan.checks]
