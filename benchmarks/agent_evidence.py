"""The GPU evidence the claude proposer puts in its first turn, for the roots of linear and attention.

    python benchmarks/agent_evidence.py [--ops linear attention] [--rounds 20] [--ncu]
                                        [--out benchmarks/results/agent_evidence_h200]

Per operator: the root is timed beside stock PyTorch in the sandboxed timing child (`--rounds` interleaved
rounds per cell, GPU profile), then the evidence child (`tik_kernels.evaluator.evidence`) compiles and runs
the root once per cell and reads back each Triton kernel variant's registers, spills, shared memory, warps and
stages. The script prints and saves the proposer's text built from them (`ClaudeProposer._evidence_text`,
exactly what the model reads), and the floor fractions of stock PyTorch for comparison. `--ncu` adds an Nsight
Compute profile of each operator's first cell where `ncu` is installed. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from benchmarks.harness import environment  # noqa: E402
from tik_kernels.contracts import get_contract  # noqa: E402
from tik_kernels.evaluator.evidence import floors, ncu_profile  # noqa: E402
from tik_kernels.evaluator.measure import run_timing  # noqa: E402
from tik_tui.agent import ProposalContext  # noqa: E402
from tik_tui.agent.claude import ClaudeProposer  # noqa: E402
from tik_tui.agent.evidence import DeviceEvidence  # noqa: E402


class RootOnly:
    """The two workspace reads DeviceEvidence makes, for one implementation (#1, the root)."""

    def __init__(self, source: str, cells: list[dict]):
        self._source, self._cells = source, cells

    def source(self, impl_id: int) -> str:
        return self._source

    def measurements(self, impl_id: int) -> list[dict]:
        return self._cells


def medians(doc: dict, name: str) -> list[dict]:
    out = []
    for cell, c in doc["cells"].items():
        samples = (c.get("samples") or {}).get(name, {}).get("event_us") or []
        out.append({"cell": cell, "median_us": statistics.median(samples) if samples else None})
    return out


def one_op(op: str, rounds: int, timeout: float, ncu: bool, device: str = "cuda") -> dict:
    contract = get_contract(op)
    source = contract.root_path.read_text()
    env = environment(device)
    profile = "gpu" if device == "cuda" else "cpu"
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tik-agent-evidence-") as d:
        path = Path(d) / f"{op}_root.py"
        path.write_text(source)
        doc, failure = run_timing(contract, [("root", path)], device=device, profile=profile, seed=0, timeout=timeout,
                                  reps=rounds, fixed_reps=True, baseline=True)
    if failure:
        raise SystemExit(f"{op}: timing failed: {failure}")
    timing_s = time.monotonic() - t0
    root_cells = [{**c, "env": env} for c in medians(doc, "root")]
    ev = DeviceEvidence(RootOnly(source, root_cells), op, device, timeout=timeout)
    t1 = time.monotonic()
    stats = ev.stats(1)
    evidence_s = time.monotonic() - t1
    ctx = ProposalContext(op=op, parent={"id": 1}, parent_source=source, device_evidence=ev)
    text = ClaudeProposer(client=object())._evidence_text(ctx)
    out = {"op": op, "text": text, "compile": ev.compile_stats(1), "floors": ev.floors(1),
           "baseline_floors": floors(medians(doc, "baseline"), stats.get("work") or {}, env.get("gpu")),
           "seconds": {"timing": round(timing_s, 1), "evidence_child": round(evidence_s, 1)}}
    if ncu:
        out["ncu"] = ncu_profile(op, source, root_cells[0]["cell"], device=device, timeout=timeout)
    return out


def markdown(env: dict, results: list[dict]) -> str:
    lines = ["# What the claude proposer reads about a parent's kernels (roots of linear and attention)", "",
             f"GPU {env.get('gpu')}, driver {env.get('driver')}, torch {env.get('torch')}, triton {env.get('triton')}",
             ""]
    for r in results:
        lines += [f"## {r['op']}", "", f"timing child {r['seconds']['timing']} s, evidence child "
                  f"{r['seconds']['evidence_child']} s", "", "| kernel | constexprs | warps | stages | registers | "
                  "spills | shared B | cells |", "|---|---|---|---|---|---|---|---|"]
        for k in r["compile"].get("kernels", []):
            consts = ", ".join(f"{a}={v}" for a, v in k["constexprs"].items())
            lines.append(f"| {k['kernel']} | {consts} | {k['num_warps']} | {k['num_stages']} | {k['registers']} | "
                         f"{k['spills']} | {k['shared_bytes']} | {len(k['cells'])} |")
        if r["compile"].get("error"):
            lines.append(f"\ncompile stats: {r['compile']['error']}")
        lines += ["", "| cell | root us | root GB/s | root TFLOP/s | root floor fraction | bound | torch floor "
                  "fraction |", "|---|---|---|---|---|---|---|"]
        base = {b["cell"]: b for b in r["baseline_floors"]}
        for c in r["floors"].get("cells", []):
            b = base.get(c["cell"], {})
            lines.append(f"| {c['cell']} | {c['median_us'] or 0:.1f} | {c.get('GB_s', '')} | {c.get('TFLOP_s', '')} | "
                         f"{c.get('floor_fraction', '')} | {c.get('bound', '')} | {b.get('floor_fraction', '')} |")
        if r.get("ncu"):
            lines += ["", "Nsight Compute, first cell: `" + json.dumps(r["ncu"])[:2000] + "`"]
        lines += ["", "As the model receives it:", "", "```", r["text"], "```", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", default=["linear", "attention"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--ncu", action="store_true", help="also profile each operator's first cell with Nsight Compute")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/agent_evidence_h200"))
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a dry run of the plumbing
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("agent_evidence: needs a CUDA GPU (compile stats and floors are not available on the interpreter)",
              file=sys.stderr)
        return 2
    env = environment(args.device)
    results = []
    for op in args.ops:
        r = one_op(op, args.rounds, args.timeout, args.ncu, args.device)
        print(f"== {op} (timing {r['seconds']['timing']} s, evidence {r['seconds']['evidence_child']} s)")
        print(r["text"])
        results.append(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"env": env, "results": results}, indent=1, default=str))
    args.out.with_suffix(".md").write_text(markdown(env, results))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
