"""Where one evaluation's time goes: the root's probes (compiling into the trusted Triton cache) against a
tuner-style candidate's (one CONFIG value changed, its cache seeded from the root's), in one process.

    python benchmarks/eval_phases.py [--op linear] [--set M16_BLOCK_N=32] [--time]
                                     [--out benchmarks/results/eval_phases_h200.json]

The candidate is the root's source with `--set` applied to its CONFIG literal. Without `--time` only the
check phases run (probes and checks); the JSON holds the report's `phases` (seconds) and verdict.

    python benchmarks/eval_phases.py --volume --op rmsnorm [--evals 3] [--out benchmarks/results/x.json]

`--volume`: the plumbing of a candidate's probes at GPU volumes, on the CPU: the op's GPU-profile plan (rmsnorm:
397 MB of inputs, 665 MB of outputs) run `--evals` times through a candidate child with a torch-only implementation
(EAGER), each broken down as the evaluator reports it (`core.probe_phases`: parent start / inputs / read, the child's
start / inputs / import / compute / send). The compute is the CPU's, not the GPU's; the rest is what moving the data
costs.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: torch-only implementations for `--volume` (the same bits are not the point: the data crossing is)
EAGER = {"rmsnorm": "import torch\n\n\ndef rmsnorm(x, w, eps=1e-6):\n    xf = x.float()\n"
                    "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)\n"}


def volume(op: str, evals: int, timeout: float, out: Path) -> int:
    import statistics

    from benchmarks.harness import environment
    from tik_kernels.contracts import get_contract
    from tik_kernels.evaluator.core import plan_for, run_probes

    if op not in EAGER:
        raise SystemExit(f"eval_phases: --volume has a torch-only implementation of {', '.join(EAGER)} only")
    impl = Path(tempfile.mkdtemp(prefix="tik-phases-")) / f"{op}_eager.py"
    impl.write_text(EAGER[op])
    t = time.perf_counter()
    plan = plan_for(get_contract(op), "gpu", 0)
    plan_s = time.perf_counter() - t
    runs = []
    for i in range(evals):
        phases: dict = {}
        t = time.perf_counter()
        _, failure = run_probes(plan, impl, "cpu", timeout, phases=phases)
        phases = {"probes_candidate": time.perf_counter() - t, **phases}
        runs.append({k: round(v, 3) for k, v in phases.items()})
        print(f"{op} #{i}: failure={failure} {json.dumps(runs[-1])}", flush=True)
    keys = list(runs[0])
    doc = {"command": " ".join(["benchmarks/eval_phases.py", *sys.argv[1:]]), "env": environment("cpu"), "op": op,
           "profile": "gpu", "plan_s": round(plan_s, 1), "runs": runs,
           "median_after_first": {k: round(statistics.median(r.get(k, 0.0) for r in runs[1:] or runs), 3)
                                  for k in keys}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["median_after_first"], indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="linear")
    ap.add_argument("--set", default="M16_BLOCK_N=32", help="NAME=VALUE in the root's CONFIG")
    ap.add_argument("--time", action="store_true", help="also time the candidate (timing and control children)")
    ap.add_argument("--volume", action="store_true", help="the GPU plan's probes through a CPU child (see above)")
    ap.add_argument("--evals", type=int, default=3, help="--volume: how many runs")
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/eval_phases_h200.json"))
    a = ap.parse_args()
    if a.volume:
        return volume(a.op, a.evals, a.timeout, a.out)
    import torch

    from benchmarks.harness import environment
    from tik_kernels.contracts import UnknownOperator, get_contract
    from tik_kernels.evaluator import evaluate
    from tik_kernels.evaluator.core import warm_root
    from tik_tui.agent.base import module_literal
    from tik_tui.agent.tuner import rewrite_config

    try:
        contract = get_contract(a.op)
    except UnknownOperator as e:
        raise SystemExit(f"eval_phases: {e}") from None
    name, eq, value = a.set.partition("=")
    if not eq or not name or not value:
        raise SystemExit(f"eval_phases: --set takes NAME=VALUE, got {a.set!r}")
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise SystemExit(f"eval_phases: --set {name}: {value!r} is not a Python literal") from None
    src = contract.root_path.read_text()
    config = module_literal(src, "CONFIG")
    if not isinstance(config, dict) or name not in config:
        raise SystemExit(f"eval_phases: {name} is not in {a.op}'s CONFIG")
    cand = Path(tempfile.mkdtemp(prefix="tik-phases-")) / f"{a.op}_candidate.py"
    # the tuner's own rewrite: the value changes in place, so every kernel keeps its line (and cache key)
    cand.write_text(rewrite_config(src, {**config, name: value}))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    # the root's probes first, on their own, so that their time is printed even if the run is cut short
    root_s = warm_root(contract, device=device, timeout=a.timeout)
    print(f"root probes (compiling into the trusted cache): {root_s:.1f} s", flush=True)
    rep = evaluate(a.op, cand, device=device, timeout=a.timeout, time_it=a.time).as_dict()
    rep["phases"]["probes_root"] = root_s
    doc = {"command": " ".join(["benchmarks/eval_phases.py", *sys.argv[1:]]), "env": environment(device),
           "op": a.op, "change": a.set, "wall_s": round(time.perf_counter() - t0, 1), "verified": rep["verified"],
           "failure": rep["failure"], "checks_passed": sum(c["passed"] for c in rep["checks"]),
           "checks": len(rep["checks"]), "elapsed_s": rep["elapsed_s"], "phases": rep["phases"],
           "objective": rep.get("objective"), "cells": len(rep.get("cells") or [])}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
