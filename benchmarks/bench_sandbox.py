"""What the candidate sandbox costs per evaluation: the same work with and without the jail, interleaved.

    python benchmarks/bench_sandbox.py [--device cpu|cuda] [--op rmsnorm] [--repeats 5] [--roots]
                                       [--out benchmarks/results/sandbox_cpu]

Three measurements, each a median over `--repeats` rounds, the jailed and the unconfined run alternating
within a round (so drift in the machine's load hits both):
- `launcher`: `python -I -S -c pass` through the launcher (isolate.py), with and without the namespaces: the
  jail's own set-up (fork, unshare, uid maps, mounts, pivot_root), without Python's imports;
- `child`: one evaluator child with an empty probe job (interpreter start, torch and tik_kernels imports);
- `evaluation`: `evaluate(op, <a copy of op's root>)` with the root's probes recomputed each time (two children,
  as a search's first evaluation of an operator), wall seconds.
`--roots`: also checks that every library root is verified in the jail on this device (the table's last part).
Writes OUT.json and OUT.md with the environment line. A loaded machine moves both columns; the difference
between them is what the sandbox costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from tik_kernels.contracts import all_contracts, get_contract  # noqa: E402
from tik_kernels.evaluator import core, evaluate, sandbox, spawn  # noqa: E402
from tik_kernels.evaluator.protocol import TensorWriter  # noqa: E402


def cpu_seconds() -> float:
    """User + system seconds of this process and every descendant it has waited for (the jail's init waits
    for the child, the holder for init, the launcher for the holder, this process for the launcher)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of fn(*args)."""
    w, c = time.perf_counter(), cpu_seconds()
    fn(*args)
    return time.perf_counter() - w, cpu_seconds() - c


def launcher(jailed: bool, device: str) -> None:
    tmp = sandbox.owned_tempdir("tik-bench-")
    try:
        (tmp / "scratch").mkdir()
        (tmp / "impl").mkdir()
        argv = [sys.executable, "-I", "-S", "-c", "pass"]
        env = {"PATH": "/usr/bin:/bin"}
        mode = sandbox.availability()[0]
        if jailed:
            spec = sandbox._spec(tmp, mode, argv, env, "/tmp", device, None)  # on cuda: the GPU nodes too
        else:
            spec = {"owner_pid": os.getpid(), "namespaces": False, "argv": argv, "env": env, "cwd": str(tmp)}
        (tmp / "spec.json").write_text(json.dumps(spec))
        subprocess.run([sys.executable, "-I", "-S", str(sandbox.ISOLATE), str(tmp / "spec.json")], check=True, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def child(jailed: bool, impl: Path, device: str) -> None:
    def inputs(tmp: Path) -> dict:
        return {"probes": [], "tensors": TensorWriter(tmp / "inputs.bin").close()}

    job = {"mode": "probes", "impl": str(impl), "device": device, "limits": sandbox.limits(120), "graph_probes": []}
    with sandbox.policy(jailed):
        out = spawn.run_child(job, inputs, lambda out, doc: doc, 120.0)
    assert out.failure is None, out.failure


def evaluation(jailed: bool, op: str, impl: Path, device: str) -> None:
    core._ROOT_CACHE.clear()  # the root's child runs every time, as in a search's first evaluation
    rep = evaluate(op, impl, device=device, time_it=False, sandbox=jailed, timeout=600)
    assert rep.verified, rep.failure


def env_line(device: str) -> dict:
    mode, why = sandbox.availability()
    return {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__, "uid": os.geteuid(),
            "jail_uid_mode": mode, "jail_unavailable": why}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--op", default="rmsnorm")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--roots", action="store_true", help="also verify every library root in the jail")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or Path(__file__).resolve().parent / "results" / f"sandbox_{args.device}"
    if sandbox.availability()[0] is None:
        sys.exit(f"bench_sandbox: the jail does not start here: {sandbox.availability()[1]}")
    doc: dict = {"env": env_line(args.device), "op": args.op, "repeats": args.repeats, "rounds": {}}
    with tempfile.TemporaryDirectory() as d:
        # a copy of the root: evaluated as a candidate (a file that is not the library's own)
        impl = Path(d) / f"{args.op}.py"
        impl.write_text(get_contract(args.op).root_path.read_text())
        trivial = Path(d) / "trivial.py"
        trivial.write_text("")
        evaluation(True, args.op, impl, args.device)  # warm: plan cache, page cache
        for name, fn, extra in (("launcher", launcher, (args.device,)), ("child", child, (trivial, args.device)),
                                ("evaluation", evaluation, (args.op, impl, args.device))):
            rows: dict = {"jailed": {"wall": [], "cpu": []}, "unconfined": {"wall": [], "cpu": []}}
            for k in range(args.repeats):
                for jailed in ((True, False) if k % 2 == 0 else (False, True)):
                    wall, cpu = timed(fn, jailed, *extra)
                    row = rows["jailed" if jailed else "unconfined"]
                    row["wall"].append(wall)
                    row["cpu"].append(cpu)
            doc["rounds"][name] = rows
            print(name, {k: {m: round(statistics.median(x), 3) for m, x in v.items()} for k, v in rows.items()},
                  flush=True)
    if args.roots:
        doc["roots"] = {}
        for op, contract in all_contracts().items():
            rep = evaluate(contract, contract.root_path, device=args.device, time_it=False, timeout=900)
            doc["roots"][op] = {"verified": rep.verified, "failure": rep.failure, "seconds": round(rep.elapsed_s, 1)}
            print(op, doc["roots"][op], flush=True)
    doc["env"]["loadavg_end"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(markdown(doc))
    print(f"wrote {out}.json and {out}.md")


def markdown(doc: dict) -> str:
    e = doc["env"]
    lines = [f"# The sandbox's cost per evaluation ({e['device']})", "",
             f"`python benchmarks/bench_sandbox.py --device {e['device']} --op {doc['op']} --repeats {doc['repeats']}`",
             "", "Environment: " + ", ".join(f"{k}={v}" for k, v in e.items()), "",
             "| what | seconds | jailed (median) | unconfined (median) | sandbox cost | relative |",
             "|---|---|---:|---:|---:|---:|"]
    what = {"launcher": "launcher + `python -I -S -c pass`", "child": "one evaluator child, empty job",
            "evaluation": f"evaluate({doc['op']}), candidate and root children"}
    for name, rows in doc["rounds"].items():
        for m in ("wall", "cpu"):
            j, u = statistics.median(rows["jailed"][m]), statistics.median(rows["unconfined"][m])
            lines.append(f"| {what[name]} | {m} | {j:.3f} | {u:.3f} | {j - u:+.3f} | {100 * (j - u) / u:+.1f}% |")
    lines += ["", "Each row: the median of the rounds; within a round the jailed and the unconfined run alternate. "
              "cpu: user + system seconds of the evaluator and every child it waited for (less sensitive to other "
              "load on the machine than wall). All samples: in the JSON."]
    if "roots" in doc:
        lines += ["", "## Library roots in the jail", "", "| op | verified | seconds | failure |", "|---|---|---:|---|"]
        lines += [f"| {op} | {r['verified']} | {r['seconds']} | {r['failure'] or ''} |"
                  for op, r in doc["roots"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
