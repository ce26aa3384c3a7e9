"""The check every plan of an operator used in training gets: the forward has the same bits with grad
enabled as under no_grad."""

from __future__ import annotations

from typing import Any

import torch

from tik_kernels.contract.compare import bitwise_equal, same_bits
from tik_kernels.contract.model import Plan, Probe, Requirement, Results

#: what `with_grad_mode_check` holds every operator used in training to
GRAD_MODE_REQUIREMENT = Requirement(
    "grad_mode_invariance", "bitwise",
    "the forward under autograd (inputs requiring grad) has the bits of the forward under no_grad: "
    "the trainer's forward is the rollout's")


def _same_arg(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and same_bits(a, b)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an argument without a usable ==: not the same call
        return False


def _same_call(p: Probe, q: Probe) -> bool:
    return (p.entry == q.entry and len(p.args) == len(q.args) and set(p.kwargs) == set(q.kwargs)
            and all(_same_arg(a, b) for a, b in zip(p.args, q.args, strict=True))
            and all(_same_arg(p.kwargs[k], q.kwargs[k]) for k in p.kwargs))


def with_grad_mode_check(plan: Plan) -> Plan:
    """Every backward probe's forward outputs (computed with grad enabled, its grad_args requiring grad) must have
    the bits of the same call under no_grad. Training (mode B) recomputes with autograd the forward the rollout
    ran without it; an implementation that switches on `torch.is_grad_enabled()` or `requires_grad` would pass
    every accuracy bound and still break the bitwise equality between them. The no_grad call is a probe the plan
    already makes on the same arguments where there is one, else a new one."""
    for p in [p for p in plan.probes if p.grad_args]:
        twin = next((q for q in plan.probes if not q.grad_args and _same_call(p, q)), None)
        if twin is None:
            twin = Probe(p.id + "@no_grad", p.entry, p.args, dict(p.kwargs))
            plan.add(twin)

        def fn(res: Results, g: str = p.id, f: str = twin.id) -> tuple:
            plain, under = res[f], res[g]
            if len(under) < len(plain):
                return False, f"{len(under)} outputs and gradients with grad enabled, {len(plain)} outputs without"
            for k, (x, y) in enumerate(zip(under[: len(plain)], plain, strict=True)):
                ok, detail, d = bitwise_equal(x, y, f"output {k}")
                if not ok:
                    return False, "forward with grad enabled differs from no_grad: " + detail, d
            return True, f"{len(plain)} outputs bitwise equal with grad enabled and under no_grad", 0.0

        plan.check(f"grad_mode_invariance[{p.id}]", GRAD_MODE_REQUIREMENT.name, fn)
    return plan
