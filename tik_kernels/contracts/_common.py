"""Plan pieces several token-wise contracts add to the standard plan. Frozen, like the contracts that use them."""

from __future__ import annotations

import dataclasses
import math

import torch

from tik_kernels.contract import Plan, TokenwiseConfig, bitwise_equal, reference_grads, reference_outputs


def with_grad_rerun(plan: Plan) -> Plan:
    """Each backward probe run twice: gradients must keep their bits (no atomics, no order that varies)."""
    for probe in [p for p in plan.probes if p.grad_args]:
        rid = plan.add(dataclasses.replace(probe, id=probe.id + "-rerun"))

        def fn(res, a: str = probe.id, b: str = rid):
            for k, (x, y) in enumerate(zip(res[a], res[b], strict=True)):
                ok, detail, d = bitwise_equal(x, y, f"output {k}")
                if not ok:
                    return False, "backward rerun differs: " + detail, d
            return True, "outputs and gradients bitwise identical on rerun", 0.0

        plan.check(probe.id.rsplit("/", 1)[0] + "/grad_determinism", "determinism", fn)
    return plan


def row_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst per-token relative RMS error: a row whose values are small is held to the same relative bound."""
    o, r = out.double().reshape(out.shape[0], -1), ref.double().reshape(ref.shape[0], -1)
    if not torch.isfinite(o).all():
        return math.inf
    return float(((o - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)).max()) if o.numel() else 0.0


def with_row_relative(plan: Plan, cfgs: list[TokenwiseConfig], tol: float) -> Plan:
    """Per-token relative error of every output and every token gradient, so tokens of small scale count too."""
    for cfg in cfgs:
        full = next(p for p in plan.probes if p.id.startswith(cfg.name + "/full["))
        bwd = next(p for p in plan.probes if p.id == cfg.name + "/backward")
        refs = reference_outputs(cfg, full.args)
        ref_g = reference_grads(cfg, bwd.args, [g.double() for g in bwd.grad_outputs])
        tok_g = [(j, a) for j, a in enumerate(cfg.grad_args) if a in cfg.token_args]
        n_out = len(refs)

        def fwd(res, pid: str = full.id, refs=refs):
            worst = max(row_error(o, r) for o, r in zip(res[pid], refs, strict=True))
            return worst <= tol, f"worst per-token rel error {worst:.3g} (<= {tol:g})", worst

        def grads(res, pid: str = bwd.id, ref_g=ref_g, tok_g=tok_g, n_out=n_out):
            got = res[pid][n_out:]
            worst = max(row_error(got[j], ref_g[j]) for j, _ in tok_g)
            return worst <= tol, f"worst per-token rel error of token gradients {worst:.3g} (<= {tol:g})", worst

        plan.check(cfg.name + "/accuracy_per_token", "accuracy", fwd)
        plan.check(cfg.name + "/gradient_per_token", "gradient", grads)
    return plan
