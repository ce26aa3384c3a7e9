"""What an evaluation moves across the process boundary before any kernel runs, on this machine's CPU.

    python benchmarks/bench_protocol.py [--ops linear attention rmsnorm] [--profile gpu]
                                        [--out benchmarks/results/protocol_cpu]

For each operator's plan: the seconds to build it (and to get it again from `plan_for`'s cache), the bytes of
tensor arguments its probes reference, how many of those are distinct tensors (what `TensorWriter` now
writes once), and the seconds to write and read back (i) every reference, as the wire format did before it
deduplicated (each reference a fresh view, so the writer cannot tell it has seen the tensor), and (ii) only
the distinct tensors, as it does now. Both reads use the current reader. Timings are single runs of file I/O
on this machine's disk, so they are indicative only; the byte counts are exact.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from tik_kernels.contracts import get_contract  # noqa: E402
from tik_kernels.evaluator.core import plan_for  # noqa: E402
from tik_kernels.evaluator.protocol import TensorWriter, read_tensors  # noqa: E402


def references(plan) -> list[torch.Tensor]:
    """Every tensor a probe's args, kwargs or grad outputs reference, in order, repeats included."""
    out: list[torch.Tensor] = []

    def walk(v) -> None:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    for p in plan.probes:
        walk(p.args)
        walk(p.kwargs)
        walk(p.grad_outputs)
    return out


def write_read(tensors: list[torch.Tensor], where: Path) -> dict:
    t = time.perf_counter()
    w = TensorWriter(where / "inputs.bin")
    for x in tensors:
        w.ref(x)
    entries = w.close()
    wrote = time.perf_counter() - t
    size = (where / "inputs.bin").stat().st_size
    t = time.perf_counter()
    back = read_tensors(where / "inputs.bin", entries)
    read = time.perf_counter() - t
    del back
    (where / "inputs.bin").unlink()
    return {"bytes": size, "write_s": round(wrote, 2), "read_s": round(read, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["linear", "attention", "rmsnorm"])
    ap.add_argument("--profile", default="gpu", choices=("gpu", "cpu"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/protocol_cpu"))
    a = ap.parse_args()
    doc = {"command": " ".join(["benchmarks/bench_protocol.py", *sys.argv[1:]]), "profile": a.profile, "ops": {}}
    tmp = Path(tempfile.mkdtemp(prefix="tik-protocol-"))
    try:
        for op in a.ops:
            contract = get_contract(op)
            t = time.perf_counter()
            plan = plan_for(contract, a.profile, 0)
            built = time.perf_counter() - t
            t = time.perf_counter()
            assert plan_for(contract, a.profile, 0) is plan
            cached = time.perf_counter() - t
            refs = references(plan)
            distinct = list({id(x): x for x in refs}.values())
            row = {"probes": len(plan.probes), "plan_build_s": round(built, 2), "plan_cached_s": round(cached, 4),
                   "referenced_bytes": sum(x.numel() * x.element_size() for x in refs),
                   "distinct_bytes": sum(x.numel() * x.element_size() for x in distinct),
                   "every_reference": write_read([x.view(x.shape) for x in refs], tmp),
                   "distinct_only": write_read(refs, tmp)}
            doc["ops"][op] = row
            print(f"{op}: {row}", flush=True)
            del plan, refs, distinct
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# probe inputs across the process boundary ({a.profile} plans, this machine's CPU)", "",
             f"`{doc['command']}`", "",
             "| op | probes | plan build s | cached s | referenced GB | distinct GB | every reference: write / read s "
             "| distinct only: write / read s |", "|---|---|---|---|---|---|---|---|"]
    for op, r in doc["ops"].items():
        e, d = r["every_reference"], r["distinct_only"]
        lines.append(f"| {op} | {r['probes']} | {r['plan_build_s']} | {r['plan_cached_s']} | "
                     f"{r['referenced_bytes'] / 1e9:.2f} | {r['distinct_bytes'] / 1e9:.2f} | "
                     f"{e['write_s']} / {e['read_s']} | {d['write_s']} / {d['read_s']} |")
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
