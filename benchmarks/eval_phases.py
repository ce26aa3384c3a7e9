"""Where one evaluation's time goes: the root's probes (compiling into the trusted Triton cache) against a
tuner-style candidate's (one CONFIG value changed, its cache seeded from the root's), in one process.

    python benchmarks/eval_phases.py [--op linear] [--set M16_BLOCK_N=32] [--time]
                                     [--out benchmarks/results/eval_phases_h200.json]

The candidate is the root's source with `--set` applied to its CONFIG literal. Without `--time` only the
check phases run (probes and checks); the JSON holds the report's `phases` (seconds) and verdict.

    python benchmarks/eval_phases.py --volume --op rmsnorm [--evals 3] [--out benchmarks/results/x.json]

    python benchmarks/eval_phases.py --probe-times --op linear [--out benchmarks/results/probe_times_h200.json]

`--probe-times`: where a probes child's `child_compute` goes, probe by probe: the root's GPU plan run here (trusted,
in this process) as the child runs it (inputs staged on the device, outputs copied into a file's pages right after
each call), twice (the first pass loads every kernel), each probe split into its call (to the device sync), its
outputs' copy and its echoed inputs' comparison; the totals and the slowest probes.

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


def probe_times(op: str, out: Path, top: int = 15) -> int:
    import torch

    from benchmarks.harness import environment
    from tik_kernels.contract import Staged, call_probe, load_module, same_bits
    from tik_kernels.contracts import get_contract
    from tik_kernels.evaluator.protocol import TensorWriter

    device = "cuda" if torch.cuda.is_available() else "cpu"
    contract = get_contract(op)
    t = time.perf_counter()
    plan = contract.plan("gpu" if device == "cuda" else "cpu", 0)
    plan_s = time.perf_counter() - t
    mod = load_module(contract.root_path, "tik_impl")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    passes = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(2):
            staged, w = Staged(device), TensorWriter(Path(tmp) / f"out{n}.bin")
            rows = []
            for probe in plan.probes:
                t0 = time.perf_counter()
                outs, args = call_probe(mod, probe, device, staged=staged)
                sync()
                t1 = time.perf_counter()
                for o in outs:
                    w.ref(o.detach())
                t2 = time.perf_counter()
                same = [same_bits(a, staged.master(h)) for a, h in
                        zip(args, [x for x in probe.args if isinstance(x, torch.Tensor)], strict=False)]
                sync()
                t3 = time.perf_counter()
                rows.append({"probe": probe.id, "call_s": t1 - t0, "outputs_s": t2 - t1, "echo_s": t3 - t2,
                             "out_mb": sum(o.numel() * o.element_size() for o in outs) / 1e6, "unchanged": all(same)})
                del outs, args
            staged.drop()
            w.close()
            total = {k: round(sum(r[k] for r in rows), 3) for k in ("call_s", "outputs_s", "echo_s", "out_mb")}
            slow = sorted(rows, key=lambda r: -(r["call_s"] + r["outputs_s"] + r["echo_s"]))[:top]
            passes.append({"total": total, "slowest": [{k: round(v, 4) if isinstance(v, float) else v
                                                        for k, v in r.items()} for r in slow]})
            print(f"pass {n}: {json.dumps(total)}", flush=True)
    doc = {"command": " ".join(["benchmarks/eval_phases.py", *sys.argv[1:]]), "env": environment(device), "op": op,
           "probes": len(plan.probes), "plan_s": round(plan_s, 1), "passes": passes}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in passes[-1]["slowest"]:
        print(f"{r['probe']:60s} call {r['call_s']:.4f}  outputs {r['outputs_s']:.4f}  echo {r['echo_s']:.4f}  "
              f"{r['out_mb']:.0f} MB")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="linear")
    ap.add_argument("--set", default="M16_BLOCK_N=32", help="NAME=VALUE in the root's CONFIG")
    ap.add_argument("--time", action="store_true", help="also time the candidate (timing and control children)")
    ap.add_argument("--volume", action="store_true", help="the GPU plan's probes through a CPU child (see above)")
    ap.add_argument("--evals", type=int, default=3, help="--volume: how many runs")
    ap.add_argument("--probe-times", action="store_true", help="the root's probes one by one, here (see above)")
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/eval_phases_h200.json"))
    a = ap.parse_args()
    if a.volume:
        return volume(a.op, a.evals, a.timeout, a.out)
    if a.probe_times:
        from tik_kernels.contracts import UnknownOperator, get_contract

        try:
            get_contract(a.op)
        except UnknownOperator as e:
            raise SystemExit(f"eval_phases: {e}") from None
        return probe_times(a.op, a.out)
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
