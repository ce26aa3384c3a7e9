"""The generic checks the evaluator adds to every contract's, evaluated in the parent on the bytes the
children sent: outputs have the root's dtypes and shapes; every probe leaves its inputs unchanged; on the
GPU, a CUDA graph replayed after its inputs changed gives a fresh call's bits."""

from __future__ import annotations

import torch

from tik_kernels.contract import CheckResult, Plan, ProbeResult, bitwise_equal

#: graph replays come back as extra results keyed by this prefix + probe id (outputs = replayed,
#: inputs_after = the eager call on the changed inputs)
GRAPH_PREFIX = "graph:"


def graph_replay_check(plan: Plan, cand: dict[str, ProbeResult], root: dict[str, ProbeResult]) -> CheckResult | None:
    """On the GPU: a CUDA graph of the call, replayed after the inputs changed in place, gives the bits of a
    fresh call on the changed inputs. Not applicable (skipped) where the root itself cannot be captured."""
    ids = [k for k in cand if k.startswith(GRAPH_PREFIX)]
    if not ids:
        return None
    name, req = "cuda_graph_replay", "graph_replay"
    n, skipped = 0, []
    for k in ids:
        c, r = cand[k], root.get(k)
        if r is not None and r.error is not None:
            skipped.append(f"{k[len(GRAPH_PREFIX):]} (root not capturable: {r.error})")
            continue
        if c.error is not None:
            return CheckResult(name, req, False,
                               f"{k[len(GRAPH_PREFIX):]}: CUDA-graph capture/replay failed: {c.error}")
        if len(c.outputs) != len(c.inputs_after or []):
            return CheckResult(name, req, False, f"{k[len(GRAPH_PREFIX):]}: replay and eager output counts differ")
        for j, (a, b) in enumerate(zip(c.outputs, c.inputs_after, strict=True)):
            ok, detail, d = (False, f"output {j}: {spec(a)} vs {spec(b)}", None) if (
                a.dtype != b.dtype or a.shape != b.shape) else bitwise_equal(a, b, f"output {j}")
            if not ok:
                return CheckResult(name, req, False, f"{k[len(GRAPH_PREFIX):]}: replay after changing the inputs "
                                   f"differs from a fresh call: {detail}", d)
        n += 1
    note = f"; skipped {', '.join(skipped)}" if skipped else ""
    return CheckResult(name, req, True, f"{n} graph replays bitwise equal to fresh calls{note}"[:300])


def output_spec(plan: Plan, cand: dict[str, ProbeResult], root: dict[str, ProbeResult]) -> CheckResult:
    """Every probe's outputs have the root's count, dtypes and shapes."""
    n = 0
    for p in plan.probes:
        c, r = cand.get(p.id), root.get(p.id)
        if c is None or r is None or c.error or r.error:
            continue
        if len(c.outputs) != len(r.outputs):
            return CheckResult("output_spec", "output_spec", False,
                               f"{p.id}: {len(c.outputs)} outputs, the root returns {len(r.outputs)}")
        for k, (x, y) in enumerate(zip(c.outputs, r.outputs, strict=True)):
            if x.dtype != y.dtype or x.shape != y.shape:
                return CheckResult("output_spec", "output_spec", False,
                                   f"{p.id}: output {k} is {spec(x)}, the root's is {spec(y)}")
        n += 1
    return CheckResult("output_spec", "output_spec", True, f"{n} probes: outputs have the root's dtypes and shapes")


def spec(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def all_inputs_unchanged(plan: Plan, cand: dict[str, ProbeResult]) -> CheckResult:
    """Every probe (not only the contract's chosen one) leaves its tensor arguments bitwise unchanged."""
    n = 0
    for p in plan.probes:
        r = cand.get(p.id)
        if r is None or r.error or r.inputs_after is None:
            continue
        sent = [a for a in p.args if isinstance(a, torch.Tensor)]
        if len(sent) != len(r.inputs_after):
            return CheckResult("inputs_unchanged[all probes]", "inputs_unchanged", False,
                               f"{p.id}: {len(r.inputs_after)} inputs echoed, {len(sent)} sent")
        for k, (a, b) in enumerate(zip(r.inputs_after, sent, strict=True)):
            ok, detail, _ = (False, f"input {k}: {spec(a)} vs {spec(b)}", None) if (
                a.dtype != b.dtype or a.shape != b.shape) else bitwise_equal(a, b, f"input {k}")
            if not ok:
                return CheckResult("inputs_unchanged[all probes]", "inputs_unchanged", False,
                                   f"{p.id}: input mutated: {detail}")
        n += 1
    return CheckResult("inputs_unchanged[all probes]", "inputs_unchanged", True,
                       f"{n} probes left their inputs bitwise unchanged")
