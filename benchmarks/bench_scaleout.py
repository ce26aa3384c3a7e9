"""Evaluations per hour against the number of GPUs, with the local executor (`tik search --workers N`).

    python benchmarks/bench_scaleout.py [--op rmsnorm|linear|attention] [--evals 24] [--gpus 1,2,4,8] [--timeout 300]
                                        [--device cuda|cpu] [--out benchmarks/results/scaleout_h200.json]

For each GPU count n (default: every count from 1 to torch.cuda.device_count()) a fresh
workspace runs one tuner search of `--evals` derivations on n evaluator processes, one per GPU,
pinned with CUDA_VISIBLE_DEVICES. The search is greedy from the root (`explore=False`), so every
count evaluates the same candidates and only the parallelism differs. Rate = evaluations
recorded / wall time of the search (workspace setup excluded; each process's cold start, the
root's probes included, is counted, as a real search pays it). Speedup = rate(n) / rate(1),
efficiency = speedup / n. Candidate children: how many evaluations' candidate children the CPU fork
server forked and how many the launcher started (each evaluation's probes phase records it). Results (JSON +
markdown, with the environment line) are written after
every count, so an interrupted run keeps what it measured; a count that fails is recorded with
its error and the next one still runs.

Where candidates are timed (a GPU), the tuner screens untried configs before each proposal (`--screen`, the
search's default width unless given; 0: off): the screens run between the evaluations, through the same executor,
so a row splits its seconds into the evaluations' and the screens' (H100, session 43: one process, 84 s of the 239
in evaluations; on the CPU with timing on, `--device cpu --time`, results/scaleout_cpu_screens_s43.md).

A count above the visible GPUs (`--gpus 1,2` on one GPU) runs that many evaluator processes sharing the GPUs
round-robin (`tik search --workers N`): their timings take turns through the device lock, their CPU work overlaps.

`--device cpu --evals 4` is a smoke test in Triton's interpreter ("GPUs" are then interpreter
processes, default counts 1 and 2): it checks the command, not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"


def default_out(env: dict, device: str) -> Path:
    if device == "cpu":
        return RESULTS / "scaleout_cpu.json"
    gpu = str(env.get("gpu") or "gpu")
    tag = "h200" if "H200" in gpu else re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_") or "gpu"
    return RESULTS / f"scaleout_{tag}.json"


def one_count(op: str, n: int, evals: int, device: str, timeout: float, screen: int | None = None,
              time_it: bool | None = None) -> dict:
    from tik_store import Workspace
    from tik_tui.cli.main import main as tik
    from tik_tui.worker import run_search

    w = Path(tempfile.mkdtemp(prefix=f"tik-scaleout-{n}-")) / "ws"
    with contextlib.redirect_stdout(io.StringIO()):
        assert tik(["-w", str(w), "init", "--json"]) == 0
    t0, t0_epoch = time.perf_counter(), time.time()
    s = run_search(w, ops=[op], proposer="tuner", budget=evals, device=device, timeout=timeout, explore=False,
                   workers=n, screen=screen, time_it=time_it)
    wall, t1_epoch = time.perf_counter() - t0, time.time()
    with Workspace.open(w) as ws:
        everything = ws.events_since(0, 100000)
        events = [e for e in everything if e["kind"] in ("evaluated", "eval_retry")]
        statuses = Counter(ws.implementation(i)["status"] for i in s["derivations"])
    # how each evaluation's candidate child started (the probes phase says: `core.probe_phases`)
    phases = [e["payload"].get("phases") or {} for e in everything if e["kind"] == "evaluation"]
    children = Counter("forked" if p.get("probes_candidate_forked") == 1.0 else "launched"
                       for p in phases if "probes_candidate_forked" in p)
    done = [e["payload"] for e in events if e["kind"] == "evaluated"]
    spans = [d["worker"]["finished"] - d["worker"]["started"] for d in done
             if d.get("worker", {}).get("started") is not None and d["worker"].get("finished") is not None]
    # the tuner's screens (`tuner._halve`: untried configs timed together before one is evaluated) run between the
    # evaluations, through the same executor: their seconds are part of the wall, not of any evaluation's span
    screens = [e["payload"] for e in everything if e["kind"] == "screen"]
    screen_s = sum(float(p.get("seconds") or 0.0) for p in screens)
    workers = sorted({f"{d['worker'].get('slot')}:{d['worker'].get('gpu')}" for d in done if d.get("worker")})
    starts = [d["worker"]["started"] for d in done if d.get("worker", {}).get("started") is not None]
    ends = sorted(d["worker"]["finished"] for d in done if d.get("worker", {}).get("finished") is not None)
    return {"gpus": n, "evaluations": len(done), "wall_s": round(wall, 2),
            "evals_per_hour": round(len(done) / wall * 3600, 1) if wall > 0 else None,
            "eval_s_median": round(statistics.median(spans), 2) if spans else None,
            "eval_s_total": round(sum(spans), 2), "retries": sum(e["kind"] == "eval_retry" for e in events),
            "statuses": dict(statuses), "children": dict(children), "workers": workers,
            # the search's start up to its first evaluation (where candidates are timed, its first screen; the
            # evaluator process's start and the root's probes are in the first evaluation's span), and where the
            # evaluations' wall went that several processes on one GPU contend for (`phase_medians`)
            "first_eval_start_s": round(min(starts) - t0_epoch, 2) if starts else None,
            "screens": len(screens), "screen_s_total": round(screen_s, 2),
            "screened_configs": (screened := sum(len(p.get("entries") or []) for p in screens if p.get("rung") == 0)),
            # candidates judged an hour: every config a screen timed against its parent, and every evaluation
            "judged_per_hour": round((screened + len(done)) / wall * 3600, 1) if wall > 0 else None,
            "after_last_eval_s": round(t1_epoch - ends[-1], 2) if ends else None,  # the search's end (processes' exit)
            # the rate once started: evaluations finished after the first, over the time from the first's end to the
            # last's (what a long search converges to; a short run's rate above is mostly the start)
            "evals_per_hour_steady": (round((len(ends) - 1) / (ends[-1] - ends[0]) * 3600, 1)
                                      if len(ends) > 2 and ends[-1] > ends[0] else None),
            "phase_medians": phase_medians(phases), "stop_reason": s["stop_reason"], "workspace": str(w)}


#: the phases of an evaluation (`EvalReport.phases`) that show processes sharing a GPU waiting for each other: a timing
#: waiting for the device's lock (`device_wait`) or for this process's starting spares (`spare_settle`), beside the
#: timing itself and the probes
CONTENDED = ("device_wait", "spare_settle", "timing_child", "control_child", "probes_root", "probes_candidate")


def phase_medians(phases: list[dict]) -> dict:
    """Median seconds of each CONTENDED phase over the evaluations that recorded it."""
    out = {}
    for k in CONTENDED:
        vals = [float(p[k]) for p in phases if isinstance(p.get(k), (int, float))]
        if vals:
            out[k] = round(statistics.median(vals), 2)
    return out


def derive(rows: list[dict]) -> None:
    base = next((r for r in rows if r.get("gpus") == 1 and r.get("evals_per_hour")), None)
    for r in rows:
        if base and r.get("evals_per_hour"):
            r["speedup"] = round(r["evals_per_hour"] / base["evals_per_hour"], 3)
            r["efficiency"] = round(r["speedup"] / r["gpus"], 3)


def write(doc: dict, out: Path) -> None:
    derive(doc["runs"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    env = doc["env"]
    lines = [f"# Scale-out: evaluations per hour vs GPUs ({env.get('gpu') or env.get('device')}, driver "
             f"{env.get('driver')}, torch {env.get('torch')}, triton {env.get('triton')})", "",
             f"`{doc['command']}`", "",
             f"{doc['op']}, tuner proposals greedy from the root, {doc['evals']} derivations per count, local "
             "executor (one evaluator process per GPU).", "",
             "| GPUs | evaluations | wall s | evals/hour | speedup | efficiency | evals/hour once started | median s "
             "per eval | seconds in evaluations / screens (rungs; configs) | configs judged/hour | first eval starts "
             "at s | after the last s | median phases s | statuses | candidate children |", "|---" * 15 + "|"]
    for r in doc["runs"]:
        if r.get("error"):
            lines.append(f"| {r['gpus']} | error: {r['error']} |" + " |" * 13)
            continue
        st = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        kids = ", ".join(f"{k} {v}" for k, v in sorted(r.get("children", {}).items()))
        ph = ", ".join(f"{k} {v}" for k, v in r.get("phase_medians", {}).items())
        lines.append(f"| {r['gpus']} | {r['evaluations']} | {r['wall_s']} | {r['evals_per_hour']} | "
                     f"{r.get('speedup', '')} | {r.get('efficiency', '')} | {r.get('evals_per_hour_steady') or ''} | "
                     f"{r['eval_s_median']} | {r['eval_s_total']} / {r.get('screen_s_total', '')} "
                     f"({r.get('screens', '')}; {r.get('screened_configs', '')}) | {r.get('judged_per_hour', '')} | "
                     f"{r.get('first_eval_start_s', '')} | {r.get('after_last_eval_s', '')} | {ph} | {st} | {kids} |")
    if doc.get("note"):
        lines += ["", doc["note"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from tik_tui.cli.common import nonneg_int

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="rmsnorm", choices=("rmsnorm", "linear", "attention"))
    p.add_argument("--evals", type=int, default=24, help="derivations per GPU count (default 24)")
    p.add_argument("--gpus", default=None, help="comma-separated counts (default 1..device_count; cpu: 1,2)")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"))
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per evaluation child (default 300)")
    p.add_argument("--screen", type=nonneg_int, default=None,
                   help="the tuner's screen width where candidates are timed (default: the search's; 0: off)")
    p.add_argument("--time", action="store_true",
                   help="on the CPU, time candidates too (`tik search --time`): the tuner then screens as on a GPU")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    available = torch.cuda.device_count() if device == "cuda" else 2
    counts = [int(c) for c in args.gpus.split(",")] if args.gpus else list(range(1, available + 1))
    from benchmarks.harness import environment

    env = environment(device)
    out = args.out or default_out(env, device)
    doc = {"bench": "scaleout", "op": args.op, "evals": args.evals, "device": device, "env": env,
           "gpus_visible": torch.cuda.device_count(), "command": " ".join(["python", *sys.argv]),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "runs": []}
    if device == "cuda" and max(counts) > available:
        # `tik search --workers N` beyond the GPUs: evaluator processes share them round-robin, their timings taking
        # turns through the device lock (tik_kernels/evaluator/devlock.py)
        doc["note"] = (f"{available} GPU(s) visible: a count above it is that many evaluator processes sharing the "
                       "GPUs round-robin, their timings taking turns (the 'GPUs' column counts workers).")
    elif device == "cuda" and available < 2:
        doc["note"] = "blocked: only one GPU visible here, so no count above 1 was run."
    for n in counts:
        print(f"scaleout: {args.op}, {n} worker(s), {args.evals} evaluations ...", file=sys.stderr, flush=True)
        try:
            row = one_count(args.op, n, args.evals, device, args.timeout, args.screen, args.time or None)
        except Exception as e:
            row = {"gpus": n, "error": f"{type(e).__name__}: {e}"[:300], "trace": traceback.format_exc()[-2000:]}
        doc["runs"].append(row)
        write(doc, out)
        print(f"scaleout: {n}: {row.get('evals_per_hour', row.get('error'))} evaluations/hour", file=sys.stderr,
              flush=True)
    print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0 if all(not r.get("error") for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
