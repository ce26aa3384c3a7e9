"""Every token-wise operator's root against its stock-PyTorch counterpart, per workload cell, in one run.

For each cell of the contract's "gpu" profile the contract builds the inputs (`bench_case`) and this
script times, interleaved in random order every round: the root implementation, the stock counterpart
the contract names (`F.rms_norm`, `torch.matmul`, eager log_softmax + gather, ...) and a device copy of
the cell's `bytes_moved` (half read, half written), which gives the copy bandwidth the memory-bound ops
are measured against. The timer is the evaluator's `Timer` (L2 flushed, device synchronized, launch
latency hidden behind a spin kernel), on purpose: these are the figures a search's evaluation sees.
(benchmarks/harness.py's graph replay is bench_speed.py's method; here the harness gives the geomean,
environment and command.) Reported per cell: medians, root / stock, root GB/s and its fraction of the
copy's GB/s; per op: the geomean ratio (all cells, decode cells, training cells) and the median copy
fraction at training sizes.

    PYTHONPATH=. python benchmarks/bench_ops.py --out benchmarks/results [--ops rmsnorm ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from benchmarks import harness as H  # noqa: E402
from tik_kernels.contracts import all_contracts  # noqa: E402
from tik_kernels.evaluator import timing  # noqa: E402

#: attention has its own benchmark (bench_attention.py: SDPA prefill and decode at B × context)
DEFAULT_OPS = ("embedding", "rmsnorm", "add_rmsnorm", "rope", "silu_mul", "linear", "logprob", "entropy", "sample")


def of(rows: list[dict], key: str, regime_: str | None = None) -> list:
    """`key` of every row (of one regime), None where a row lacks it."""
    return [r.get(key) for r in rows if regime_ is None or r.get("regime") == regime_]


def med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def regime(cell) -> str:
    """"decode" for rollout cells (and linear's M <= 64, the issue's small-T target), else "train"."""
    if "M" in cell.params:
        return "decode" if cell.params["M"] <= 64 else "train"
    return "decode" if "/decode" in cell.name else "train"


def host_us(fn, n: int = 50) -> float:
    """Host time per call, calls queued back to back without a sync: the launch overhead a decode step pays
    unless it runs under a CUDA graph."""
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / n
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return us


def time_cell(timer, fns: dict, rounds: int, warmup: int) -> dict:
    for _ in range(warmup):
        for f in fns.values():
            f()
    if timer.cuda:
        torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for _ in range(rounds):
        random.shuffle(names)
        for k in names:
            _, us, _ = timer.sample(fns[k])
            samples[k].append(us)
    return {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v), "n": len(v),
                "host_us": host_us(fns[k]) if timer.cuda else None}
            for k, v in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--ops", nargs="+", default=list(DEFAULT_OPS))
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--spin-us", type=float, default=timing.SPIN_US,
                    help="GPU idle queued ahead of each timed call, to hide the host's launch time (default: the "
                         f"evaluator's, {timing.SPIN_US:g})")
    ap.add_argument("--max-cells", type=int, default=0, help="at most this many cells per op (0: all)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    H.line_buffered()
    env = H.environment()
    timing.SPIN_US = args.spin_us  # read when the Timer calibrates its spin kernel
    timer = timing.Timer(device)
    contracts = all_contracts()
    doc = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter timings)",
           "torch": torch.__version__, "triton": env["triton"], "rounds": args.rounds, "env": env,
           "command": H.command_line(), "ops": {}}
    name = "ops_h200" if device == "cuda" else "ops_cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    for op in args.ops:
        c = contracts[op]
        mod = importlib.import_module(c.impl)
        cells = c.cells(args.profile)
        if args.max_cells:
            cells = cells[: args.max_cells]
        rows = []
        t0 = time.time()
        for cell in cells:
            try:
                case = c.bench_case(cell, 0, device)
                entry = getattr(mod, case.entry)
                fns = {"root": lambda e=entry, a=case.args, k=case.kwargs: e(*a, **k)}
                if case.baseline is not None:
                    fns["stock"] = case.baseline
                if case.bytes_moved:
                    half = case.bytes_moved // 2
                    src = torch.empty(half, dtype=torch.uint8, device=device)
                    dst = torch.empty_like(src)
                    fns["copy"] = lambda s=src, d=dst: d.copy_(s)
                t = time_cell(timer, fns, args.rounds, args.warmup)
                row = {"cell": cell.name, "coeff": cell.coeff, "times": t, "regime": regime(cell)}
                if "stock" in t:
                    row["ratio_root_over_stock"] = t["root"]["median_us"] / t["stock"]["median_us"]
                if "copy" in t:
                    gbs = case.bytes_moved / (t["root"]["median_us"] * 1e3)
                    copy_gbs = case.bytes_moved / (t["copy"]["median_us"] * 1e3)
                    row |= {"root_GBps": gbs, "copy_GBps": copy_gbs, "copy_fraction": gbs / copy_gbs}
                del case, fns
            except Exception as e:  # one broken cell is a result, not the end of the run
                row = {"cell": cell.name, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(json.dumps({op: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                                   if k not in ("times",)}}), flush=True)
        summary = {
            "cells": len(rows), "errors": sum(1 for r in rows if "error" in r), "seconds": time.time() - t0,
            "geomean_ratio": H.geomean(of(rows, "ratio_root_over_stock")),
            "geomean_ratio_decode": H.geomean(of(rows, "ratio_root_over_stock", "decode")),
            "geomean_ratio_train": H.geomean(of(rows, "ratio_root_over_stock", "train")),
            "median_host_us_root": med([r["times"]["root"].get("host_us") for r in rows if "times" in r]),
            "median_host_us_stock": med([r["times"].get("stock", {}).get("host_us") for r in rows if "times" in r]),
            "median_copy_fraction_train": med(of(rows, "copy_fraction", "train")),
        }
        doc["ops"][op] = {"summary": summary, "cells": rows}
        print(json.dumps({op: summary}), flush=True)
        H.write_json(args.out / f"{name}.json", doc)  # after every op: a cut run keeps its part
    lines = [f"# Token-wise operators vs stock PyTorch ({doc['device']}, torch {doc['torch']}, triton {doc['triton']})",
             "", "Medians of interleaved rounds in one run; ratio = root time / stock time (lower is better); "
             "copy fraction = root GB/s over a device copy of the same bytes. GPU times are device times with the "
             f"host's launch hidden behind {args.spin_us:g} us of queued GPU idle; host µs = host time per call queued "
             "back to back (the launch cost a decode step pays without CUDA graphs).", "",
             "| op | cells | geomean ratio | decode | train | copy fraction (train, median) | host µs root / stock |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def f(v):
        return "—" if v is None else f"{v:.3f}"

    for op, d in doc["ops"].items():
        s = d["summary"]
        lines.append(f"| {op} | {s['cells']} | {f(s['geomean_ratio'])} | {f(s['geomean_ratio_decode'])} | "
                     f"{f(s['geomean_ratio_train'])} | {f(s['median_copy_fraction_train'])} | "
                     f"{f(s['median_host_us_root'])} / {f(s['median_host_us_stock'])} |")
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
