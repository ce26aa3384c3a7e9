"""The IR store at scale (CPU): record 10,000 derivations, then time the queries a viewer and the agent make.

    python benchmarks/bench_store.py [--n 10000] [--reps 7] [--out benchmarks/results/store_cpu.json]

Each query is timed as the median of interleaved repetitions, beside a baseline measured in the same
run: the raw sqlite3 read of the same rows (what any store must pay), so `ratio` is the store's
overhead. `tik log --json` is also timed end to end as a fresh process (interpreter start included).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tik_store import Workspace  # noqa: E402
from tik_tui.cli.main import main as tik  # noqa: E402


def source(i: int) -> str:
    return (f'"""derivation {i}"""\n\nTUNABLES = {{"BLOCK": (64, 128, 256)}}\n'
            f'CONFIG = {{"BLOCK": {64 << (i % 3)}}}\n\n\ndef toy(x):\n    # variant {i}\n    return x * {i % 97}\n')


def report(rng: random.Random, verified: bool) -> dict:
    obj = rng.uniform(5, 50)
    return {"verified": verified, "failure": None if verified else "batch_invariance/T=7", "eligible": False,
            "admissible": verified, "objective": obj if verified else None, "incumbent_objective": 30.0,
            "checks": [{"name": f"check{k}", "requirement": "batch_invariant", "passed": verified or k, "detail": "",
                        "max_diff": 0.0} for k in range(4)],
            "cells": [{"cell": f"T={t}", "coeff": 1.0, "limit": 0.05, "median_us": obj, "spread_us": 0.1,
                       "samples": 20} for t in (1, 64, 4096)],
            "env": {"device": "cuda", "gpu": "NVIDIA H200", "driver": "570", "torch": "2.11", "triton": "3.6"}}


def build(path: Path, n: int) -> dict:
    rng = random.Random(0)
    ws = Workspace.init(path)
    ws.ensure_operator("toy", "bench", {}, "fp")
    good = [ws.add_implementation("toy", source(0), proposer="root", status="promoted")]
    t_add, t_eval = [], []
    for i in range(1, n):
        # parents from the recent frontier, so lineages grow deep; one in ten a merge
        recent = good[-30:]
        parents = rng.sample(recent, 2) if len(recent) > 2 and rng.random() < 0.1 else [rng.choice(recent)]
        t0 = time.perf_counter()
        impl = ws.add_implementation("toy", source(i), parents=parents, proposer="tuner", rationale=f"variant {i}",
                                     usage={"model": "m", "input_tokens": 100, "output_tokens": 10, "cost_usd": 1e-3})
        t1 = time.perf_counter()
        ok = rng.random() < 0.7
        ws.record_evaluation(impl, report(rng, ok))
        t_eval.append(time.perf_counter() - t1)
        t_add.append(t1 - t0)
        if ok:
            good.append(impl)
        if i % 1000 == 0:
            print(f"  {i} derivations, {statistics.median(t_add[-1000:]) * 1e3:.2f} ms per add_implementation",
                  file=sys.stderr)
    deepest = max(good[-50:], key=lambda g: len(ws.lineage(g)))
    ws.close()
    return {"add_ms": _stats(t_add), "evaluate_ms": _stats(t_eval), "deepest": deepest}


def _stats(xs: list[float]) -> dict:
    xs = sorted(x * 1e3 for x in xs)
    return {"median": statistics.median(xs), "p10": xs[len(xs) // 10], "p90": xs[9 * len(xs) // 10],
            "total_s": sum(xs) / 1e3, "n": len(xs)}


def _tik_log_json(path: Path) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        tik(["log", "--json", "-w", str(path)])
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/store_cpu.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tik-bench-"))
    path = tmp / "ws"
    print(f"recording {args.n} derivations in {path}", file=sys.stderr)
    t0 = time.perf_counter()
    built = build(path, args.n)
    build_s = time.perf_counter() - t0
    ws = Workspace.open(path)
    raw = sqlite3.connect(path / "tik.db")
    last = ws.last_event_id()
    deepest = built["deepest"]
    # checked once, outside the timings: parsing 5 MB of JSON is the reader's cost, not `tik log`'s
    assert _tik_log_json(path) == json.dumps(ws.implementations(), default=str) + "\n"
    cases = {
        # name: (store call, baseline raw-sqlite call doing the same read)
        "log_json (tik log --json, in-process)": (
            lambda: _tik_log_json(path),
            lambda: json.dumps(raw.execute("SELECT * FROM implementations").fetchall())),
        "implementations()": (lambda: ws.implementations(), lambda: raw.execute("SELECT * FROM implementations")
                              .fetchall()),
        "frontier(op)": (lambda: ws.frontier("toy"), lambda: raw.execute(
            "SELECT * FROM implementations WHERE op='toy' AND status IN ('verified','eligible','promoted') "
            "ORDER BY objective").fetchall()),
        "lineage(deepest)": (lambda: ws.lineage(deepest), lambda: raw.execute(
            "WITH RECURSIVE a(id) AS (SELECT ? UNION ALL SELECT i.parent_id FROM implementations i JOIN a "
            "ON i.id = a.id WHERE i.parent_id IS NOT NULL) SELECT * FROM a", [deepest]).fetchall()),
        "events_since(last-500)": (lambda: ws.events_since(last - 500), lambda: raw.execute(
            "SELECT * FROM events WHERE id > ? ORDER BY id LIMIT 500", [last - 500]).fetchall()),
        "promotion_queue()": (lambda: ws.promotion_queue(), lambda: raw.execute(
            "SELECT * FROM implementations WHERE status='eligible'").fetchall()),
        "attempts(op, parent=root)": (lambda: ws.attempts("toy", parent=1), lambda: raw.execute(
            "SELECT * FROM implementations WHERE parent_id = 1").fetchall()),
        "implementation(id) + source(id)": (lambda: (ws.implementation(deepest), ws.source(deepest)),
                                            lambda: raw.execute("SELECT * FROM implementations WHERE id = ?",
                                                                [deepest]).fetchall()),
    }
    times: dict[str, dict[str, list[float]]] = {k: {"store": [], "baseline": []} for k in cases}
    for _ in range(args.reps):
        for name, (fn, base) in cases.items():
            for which, f in (("store", fn), ("baseline", base)):
                t = time.perf_counter()
                f()
                times[name][which].append(time.perf_counter() - t)
    queries = {}
    for name, t in times.items():
        s, b = statistics.median(t["store"]) * 1e3, statistics.median(t["baseline"]) * 1e3
        queries[name] = {"median_ms": s, "min_ms": min(t["store"]) * 1e3, "baseline_median_ms": b,
                         "ratio_vs_raw_sqlite": s / b if b else None}
    cli = []
    for _ in range(args.reps):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "tik_tui.cli.main", "log", "--json", "-w", str(path)],
                             capture_output=True, text=True, check=True)
        cli.append(time.perf_counter() - t)
        assert len(json.loads(out.stdout)) == args.n
    t = time.perf_counter()
    problems = ws.doctor(in_flight_s=0)
    doctor_s = time.perf_counter() - t
    result = {
        "what": f"store: record {args.n} derivations (70% verified, 10% merges), then query",
        "env": {"python": platform.python_version(), "machine": platform.machine(), "cpu": platform.processor(),
                "sqlite": sqlite3.sqlite_version, "note": "shared 2-core CPU VM, other jobs running"},
        "n": args.n, "lineage_depth": len(ws.lineage(deepest)), "build_s": build_s,
        "add_implementation_ms": built["add_ms"], "record_evaluation_ms": built["evaluate_ms"],
        "queries": queries,
        "tik_log_json_process_s": {"median": statistics.median(cli), "runs": cli},
        "doctor_s": doctor_s, "doctor_problems": problems,
        "db_mb": (path / "tik.db").stat().st_size / 2**20,
    }
    ws.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# store benchmark ({args.n} derivations, CPU)", "",
             f"build {build_s:.1f} s; add_implementation median {built['add_ms']['median']:.2f} ms, "
             f"record_evaluation median {built['evaluate_ms']['median']:.2f} ms; doctor {doctor_s:.1f} s "
             f"({len(problems)} problems)", f"`tik log --json` as a fresh process: median "
             f"{statistics.median(cli):.2f} s of {len(cli)} runs (interpreter start and imports included)", "",
             "| query | median ms | raw sqlite ms | ratio |", "|---|---|---|---|"]
    for name, q in queries.items():
        lines.append(f"| {name} | {q['median_ms']:.2f} | {q['baseline_median_ms']:.2f} | "
                     f"{q['ratio_vs_raw_sqlite']:.1f} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
