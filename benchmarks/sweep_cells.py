"""What a launch chosen cell by cell could gain over the linear root's launches, read from sweeps already run.

    python benchmarks/sweep_cells.py benchmarks/results/linear_sweep_h100_k2048_s45 [DIR ...] [--out FILE]

`sweep_linear.py` times, for every cell (projection x M), the entry point's launch and each candidate of the bucket
that serves the cell, all in one run against cuBLAS, and then summarizes per bucket: the one candidate with the
lowest geomean over the bucket's cells. A launch that wins a few cells by far and loses the others is hidden by that
summary. This reads each sweep's sweep.json (no GPU) and writes, per cell, the entry point's ratio to cuBLAS, the
best candidate's launch and ratio, and per bucket the geomean of the entry point against that of the best candidate
of every cell (the oracle a per-shape rule could at most reach on this run's launches; a bound, not a promise: it
picks on the same noisy medians it reports).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def best_launch(cell: dict) -> tuple[str, float] | None:
    """A sweep cell's fastest candidate launch (the entry point left out) and its ratio to cuBLAS; None without one."""
    cands = {k: v for k, v in cell["us"].items() if k != "linear"}
    if not cands:
        return None
    best = min(cands, key=cands.get)
    return best, cands[best] / cell["cublas_us"]


def cells(sweep: dict) -> list[dict]:
    """Per cell: proj, M, N, K, bucket, the entry point's ratio and the best candidate (launch, ratio)."""
    out = []
    for c in sweep["cells"]:
        best = best_launch(c)
        if best is None:
            continue
        out.append({"proj": c["proj"], "M": c["M"], "N": c["N"], "K": c["K"], "bucket": c["bucket"],
                    "linear": c["linear_us"] / c["cublas_us"], "best": best[0], "best_ratio": best[1]})
    return out


def report(name: str, sweep: dict) -> list[str]:
    rows = cells(sweep)
    lines = [f"## {name}", "", f"`{sweep.get('command', '?')}`  ", f"{sweep.get('env', {}).get('gpu', '?')}", "",
             "| cell | bucket | entry point | best launch | its ratio | best / entry |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['proj']} M={r['M']} (N={r['N']}, K={r['K']}) | {r['bucket']} | {r['linear']:.3f} | "
                     f"{r['best']} | {r['best_ratio']:.3f} | {r['best_ratio'] / r['linear']:.3f} |")
    lines += ["", "| bucket | cells | entry point geomean | best per cell geomean |", "|---|---|---|---|"]
    for b in sorted({r["bucket"] for r in rows}) + ["all"]:
        sel = [r for r in rows if b in ("all", r["bucket"])]
        lines.append(f"| {b} | {len(sel)} | {geomean([r['linear'] for r in sel]):.3f} | "
                     f"{geomean([r['best_ratio'] for r in sel]):.3f} |")
    small = [r for r in rows if r["M"] <= 16]
    if small:
        lines.append(f"| M <= 16 | {len(small)} | {geomean([r['linear'] for r in small]):.3f} | "
                     f"{geomean([r['best_ratio'] for r in small]):.3f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="sweep_linear.py output folders (each with sweep.json)")
    ap.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    args = ap.parse_args(argv)
    lines = ["# Linear launches cell by cell (benchmarks/sweep_cells.py)", "",
             "Ratios are time over cuBLAS's in the same run (medians); `best` is the fastest candidate of the bucket",
             "that serves the cell; the entry point is the root's own launch as that run's CONFIG made it.", "",
             "`python benchmarks/sweep_cells.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`", ""]
    for d in args.sweeps:
        f = d / "sweep.json"
        if not f.is_file():
            print(f"sweep_cells: no sweep.json in {d}", file=sys.stderr)
            return 2
        try:
            lines += report(d.name, json.loads(f.read_text()))
        except (ValueError, KeyError, TypeError) as e:  # not JSON, or not a sweep_linear.py sweep
            print(f"sweep_cells: {f} is not a sweep_linear.py sweep.json ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
