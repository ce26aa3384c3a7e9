"""The offline tuner searching real operators on this machine, end to end through `tik search`.

    python benchmarks/tuner_search.py [--ops linear rmsnorm] [--budget 8] [--max-time 400] [--screen N]
                                      [--device cuda|cpu] [--export DIR] [--out benchmarks/results/tuner_h200]
                                      [--workspace DIR]

For each operator a fresh workspace is made (`tik init`) and `tik search --op OP --proposer tuner
--auto-promote` runs in it as a separate process, exactly as a user would run it (`--workspace DIR`:
in DIR/<op> instead, kept, and reused when it exists, so a second run goes on from the first's IR:
its tried and screened configs are not tried again). The search's output is streamed to the .log
as it runs. Afterwards the IR is read back and summarised:

- every derivation with its status, failure, objective and the root's objective *measured in the
  same evaluation* (the evaluator times candidate, root and incumbent interleaved in one process),
  so each ratio is a same-run ratio, never two numbers from different runs;
- the best implementation (the incumbent at the end) and its speedup over the root;
- every promoted node with the number of contract checks it passed on this device (an evaluation
  runs the operator's whole contract for the device before timing; a promoted node must show them
  all passed, and the script fails if one does not);
- the tuner's screens (successive halving before an evaluation): rungs, configs screened, seconds.

`--export DIR` writes each incumbent that is not the root to DIR/<op>.py, for
`benchmarks/bench_e2e.py --impl-dir DIR`. Results (JSON + markdown + the search's own output)
are written after every operator, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tik_store import Workspace, WorkspaceError  # noqa: E402


def tik(*argv: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tik_tui.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout)


def objectives(cells: list[dict]) -> tuple[float | None, float | None]:
    """(candidate, root) objective from one evaluation's cells: Σ coeff · median, both timed in that run."""
    if not cells or any(c.get("median_us") is None or c.get("root_median_us") is None for c in cells):
        return None, None
    cand = sum(float(c.get("coeff") or 1.0) * c["median_us"] for c in cells)
    root = sum(float(c.get("coeff") or 1.0) * c["root_median_us"] for c in cells)
    return cand, root


def evaluation_phases(ws: Workspace, op: str) -> dict[int, dict]:
    """impl id -> {elapsed_s, phases} of its last evaluation, from the IR's evaluation events."""
    return {e["impl_id"]: {"elapsed_s": e["payload"].get("elapsed_s"), "phases": e["payload"].get("phases") or {}}
            for e in ws.events(kind="evaluation", op=op) if e["impl_id"] is not None}


def screens(ws: Workspace, op: str) -> dict:
    """The tuner's screen events: how many rungs and configs, the seconds they took, each rung's best."""
    rungs = []
    for e in ws.events(kind="screen", op=op):
        p = e["payload"]
        ok = [x for x in p.get("entries", []) if x.get("speedup") is not None]
        top = max(ok, key=lambda x: x["speedup"], default=None)
        rungs.append({"parent": e["impl_id"], "rung": p.get("rung"), "rounds": p.get("rounds"),
                      "n": len(p.get("entries", [])), "seconds": p.get("seconds"), "failure": p.get("failure"),
                      "errors": sum(1 for x in p.get("entries", []) if x.get("error")),
                      "best": None if top is None else {"changed": top["changed"], "speedup": top["speedup"]},
                      "picked": p.get("pick") is not None})
    return {"rungs": rungs, "configs": sum(r["n"] for r in rungs if r["rung"] == 0),
            "seconds": sum(r["seconds"] or 0.0 for r in rungs)}


def summarise(ws: Workspace, op: str) -> dict:
    root = ws.root(op)
    phases = evaluation_phases(ws, op)
    rows = []
    for impl in ws.implementations(op):
        cells = ws.measurements(impl["id"])
        checks = ws.checks(impl["id"])
        cand, root_obj = objectives(cells)
        rows.append({
            "id": impl["id"], "parents": impl["parents"], "status": impl["status"], "proposer": impl["proposer"],
            "rationale": impl["rationale"], "failure": impl.get("failure"),
            "objective_us": cand, "root_objective_us_same_run": root_obj,
            "speedup_vs_root": root_obj / cand if cand and root_obj else None,
            "n_checks": len(checks), "n_checks_passed": sum(c["passed"] for c in checks),
            "failed_checks": [f"{c['name']}: {c['detail']}"[:200] for c in checks if not c["passed"]],
            "evaluation": phases.get(impl["id"]),
            "cells": [{k: c.get(k) for k in ("cell", "coeff", "median_us", "spread_us", "root_median_us",
                                              "incumbent_median_us", "ratio_vs_root", "samples")} for c in cells],
        })
    derived = [r for r in rows if r["id"] != root["id"]]
    promoted = [r for r in derived if r["status"] == "promoted"]
    inc = ws.incumbent(op)
    best = next((r for r in rows if inc and r["id"] == inc["id"]), None)
    return {
        "op": op, "root_id": root["id"], "derivations": len(derived),
        "evaluated": sum(1 for r in derived if r["status"] not in ("proposed", "evaluating")),
        "statuses": dict(Counter(r["status"] for r in derived)),
        "best": None if best is None else {k: best[k] for k in ("id", "status", "rationale", "objective_us",
                                                                 "root_objective_us_same_run", "speedup_vs_root",
                                                                 "n_checks", "n_checks_passed")},
        "promoted": [{k: r[k] for k in ("id", "objective_us", "speedup_vs_root", "n_checks", "n_checks_passed",
                                        "failed_checks")} for r in promoted],
        "every_promoted_passed_contract": all(r["n_checks"] > 0 and r["n_checks"] == r["n_checks_passed"]
                                              for r in promoted),
        "screens": screens(ws, op),
        "rows": rows,
    }


def markdown(doc: dict) -> str:
    lines = [f"# tuner search ({doc['env'].get('gpu') or doc['device']})", "",
             f"command: `{doc['command']}`", ""]
    for op, r in doc["ops"].items():
        if "error" in r:
            lines += [f"## {op}: error", "", f"{r['error']}", ""]
            continue
        b = r["best"] or {}
        sp = b.get("speedup_vs_root")
        checked = ", ".join(f"#{p['id']} {p['n_checks_passed']}/{p['n_checks']}" for p in r["promoted"]) or "-"
        lines += [f"## {op}", "",
                  f"{r['derivations']} derivations ({r['statuses']}), "
                  + (f"{r['derivations'] - r['implementations_before'] + 1} of them this run, "
                     if r.get("implementations_before") else "")
                  + f"in {r['search_wall_s']:.0f} s ({r['evals_per_hour']:.0f} evaluations/hour); "
                  f"stop: {r['stop_reason']}",
                  f"best: #{b.get('id')} ({b.get('rationale')}) — objective {_f(b.get('objective_us'))} µs vs root "
                  f"{_f(b.get('root_objective_us_same_run'))} µs in the same evaluation: "
                  + (f"**{sp:.3f}× faster**" if sp else "(the root stayed the incumbent)"),
                  f"promoted nodes: {len(r['promoted'])}, every one passed the full contract on this device: "
                  f"{r['every_promoted_passed_contract']} "
                  f"({checked})",
                  "", "| id | parents | status | objective µs | root µs (same run) | speedup | checks "
                  "| rationale / failure |",
                  "|---|---|---|---|---|---|---|---|"]
        for x in r["rows"]:
            note = x["failure"] or x["rationale"] or ""
            lines.append(f"| {x['id']} | {','.join(map(str, x['parents'])) or '-'} | {x['status']} | "
                         f"{_f(x['objective_us'])} | {_f(x['root_objective_us_same_run'])} | "
                         f"{_f(x['speedup_vs_root'], 3)} | {x['n_checks_passed']}/{x['n_checks']} | "
                         f"{note[:90].replace('|', '/')} |")
        timed = [x for x in r["rows"] if (x.get("evaluation") or {}).get("phases")]
        if timed:
            names = sorted({k for x in timed for k in x["evaluation"]["phases"]})
            lines += ["", "Where each evaluation's time went (seconds):", "",
                      "| id | total | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
            for x in timed:
                ev = x["evaluation"]
                lines.append(f"| {x['id']} | {_f(ev.get('elapsed_s'), 1)} | "
                             + " | ".join(_f(ev["phases"].get(k), 1) for k in names) + " |")
        sc = r.get("screens") or {}
        if sc.get("rungs"):
            lines += ["", f"Screens (successive halving before an evaluation): {sc['configs']} configs screened "
                          f"in {sc['seconds']:.0f} s", "",
                      "| parent | rung | configs | rounds/cell | s | errors | best (speedup vs parent) | picked |",
                      "|---|---|---|---|---|---|---|---|"]
            for g in sc["rungs"]:
                best = g["best"]
                desc = (", ".join(f"{k}={v}" for k, v in best["changed"].items()) + f": {best['speedup']:.3f}"
                        if best else (g["failure"] or "-"))
                lines.append(f"| {g['parent']} | {g['rung']} | {g['n']} | {g['rounds']} | {_f(g['seconds'], 0)} | "
                             f"{g['errors']} | {desc[:100].replace('|', '/')} | {'yes' if g['picked'] else '-'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _search(argv: list[str], log_path: Path, limit: float) -> tuple[int | str, str]:
    """Run `tik <argv>`, its output streamed into the log (a run cut short by an outer limit still shows how far it
    got); killed after `limit` seconds (rc "stopped": a search killed mid-evaluation resumes from the store)."""
    with open(log_path, "a") as out_f:
        start = out_f.tell()
        proc = subprocess.Popen([sys.executable, "-m", "tik_tui.cli.main", *argv], stdout=out_f,
                                stderr=subprocess.STDOUT, text=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "stopped"
    with open(log_path) as f:
        f.seek(start)
        return rc, f.read()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["linear", "rmsnorm"])
    ap.add_argument("--budget", type=int, default=8, help="derivations per operator (default 8)")
    ap.add_argument("--max-time", type=float, default=400.0, help="seconds per operator's search (default 400)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per evaluation child (default 240)")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"))
    ap.add_argument("--export", type=Path, default=None, help="write non-root incumbents to DIR/<op>.py")
    ap.add_argument("--out", type=Path, default=None, help="path prefix of the .json/.md/.log (default: by device)")
    ap.add_argument("--screen", type=int, default=None, help="the tuner's screen width (default: tik's)")
    ap.add_argument("--workspace", type=Path, default=None,
                    help="keep each operator's workspace in DIR/<op>, going on from it when it exists")
    ap.add_argument("--wall", type=float, default=None,
                    help="stop this run's search after S seconds (killed: the next run with the same --workspace "
                         "resumes it from the store) and summarise; --max-time counts the search's whole wall time "
                         "over its runs, so a 20-minute search in calls of 10 is --max-time 1200 --wall 540 twice")
    ap.add_argument("--summary-only", action="store_true",
                    help="run no search: summarise the IR of --workspace DIR/<op> as it is")
    args = ap.parse_args()
    if args.summary_only and not args.workspace:
        ap.error("--summary-only needs --workspace")
    import torch

    from benchmarks.harness import environment

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out or Path("benchmarks/results") / ("tuner_h200" if device == "cuda" else "tuner_cpu")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"what": "tik search --proposer tuner --auto-promote per operator, fresh workspace each",
           "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "device": device,
           "env": environment(device), "budget": args.budget, "ops": {}}
    log_path = out.with_suffix(".log")
    if args.summary_only:  # the searches' own logs stay as they are
        log_path = Path(tempfile.mkdtemp(prefix="tik-tuner-summary-")) / "unused.log"
    log_path.write_text("")
    log = log_path.open("a", buffering=1)  # appending, like the search's own output written into it
    failed = False
    for op in args.ops:
        if args.workspace:
            ws_path = args.workspace / op
        else:
            ws_path = Path(tempfile.mkdtemp(prefix=f"tik-tuner-{op}-")) / "ws"
        before = 0
        if args.summary_only and not ws_path.exists():
            doc["ops"][op] = {"error": f"no workspace at {ws_path}"}
            failed = True
            continue
        if ws_path.exists():
            try:
                with Workspace.open(ws_path) as ws:
                    before = len(ws.implementations(op))
            except WorkspaceError as e:
                print(f"tuner_search: {op}: {e}", file=sys.stderr)
                doc["ops"][op] = {"error": str(e)}
                failed = True
                continue
        else:
            init = tik("init", "-w", str(ws_path))
            if init.returncode != 0:
                doc["ops"][op] = {"error": f"tik init: {init.stderr.strip()}"}
                failed = True
                continue
        argv = ["search", "-w", str(ws_path), "--op", op, "--proposer", "tuner", "--budget", str(args.budget),
                "--auto-promote", "--device", device, "--timeout", str(args.timeout), "--max-time", str(args.max_time)]
        if args.screen is not None:
            argv += ["--screen", str(args.screen)]
        if device == "cpu":
            argv.append("--time")
        if args.summary_only:
            with Workspace.open(ws_path) as ws:
                # the machine the evaluations ran on, not this one
                envs = [m.get("env") or {} for i in ws.implementations(op) for m in ws.measurements(i["id"])[:1]]
            doc["env"] = next((e for e in envs if e.get("gpu")), doc["env"])
            doc["device"] = doc["env"].get("device", device)
        print(f"== {op}: " + ("summary of the IR, no search" if args.summary_only else f"tik {' '.join(argv)}")
              + (f" (going on from {before} implementations)" if before and not args.summary_only else ""),
              file=sys.stderr, flush=True)
        log.write(f"== {op}: tik {' '.join(argv)}\n")
        log.flush()
        t0 = time.perf_counter()
        if args.summary_only:
            rc, stdout = 0, "summary only: no search run"
        else:
            rc, stdout = _search(argv, log_path, min(args.max_time + 2 * args.timeout + 120, args.wall or math.inf))
        wall = time.perf_counter() - t0
        log.write(f"-- rc {rc}, {wall:.1f} s\n")
        log.flush()
        ws = Workspace.open(ws_path)
        try:
            summary = summarise(ws, op)
            inc = ws.incumbent(op)
            if args.export and inc and inc["id"] != summary["root_id"]:
                args.export.mkdir(parents=True, exist_ok=True)
                (args.export / f"{op}.py").write_text(ws.source(inc["id"]))
        finally:
            ws.close()
        summary.update(search_rc=rc, search_wall_s=wall, implementations_before=before,
                       evals_per_hour=(summary["evaluated"] - max(0, before - 1)) / wall * 3600,
                       stop_reason=(stdout.strip().splitlines() or ["?"])[-1][:200], workspace=str(ws_path))
        failed |= rc not in (0, "stopped") or not summary["every_promoted_passed_contract"]
        doc["ops"][op] = summary
        out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(doc))
        b = summary["best"] or {}
        print(f"{op}: {summary['derivations']} derivations {summary['statuses']} in {wall:.0f} s; best #{b.get('id')} "
              f"speedup vs root {_f(b.get('speedup_vs_root'), 3)}; promoted all passed contract: "
              f"{summary['every_promoted_passed_contract']}", file=sys.stderr, flush=True)
    log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
