"""Evaluations per hour on the CPU interpreter, this tree side by side with another checkout, interleaved over rounds.

    python benchmarks/bench_scaleout_side.py --base DIR [--ops linear:24,attention:8,rmsnorm:48] [--rounds 3]
                                             [--workers 1,2] [--out benchmarks/results/scaleout_cpu_side.json]

Each round runs, for every op, `bench_scaleout.py --device cpu --op OP --evals N --gpus WORKERS` of the base checkout
(`--base`, a worktree of the commit to compare against, e.g. `git worktree add ../base 12b05fb`) and of this tree, one
after the other, the order alternating from round to round, so both see the same machine in the same minutes. The
summary (JSON, and markdown beside it) has every run's evaluations per hour, and per op and worker count the median
over rounds of each side and their ratio (this tree / base).

The base's `bench_scaleout.py` must accept the op: 12b05fb's takes `--op rmsnorm|linear`, so add `attention` to its
choices there (nothing else) to compare attention. Its worktree must live outside /tmp, which the jail replaces.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HERE = Path(__file__).resolve().parents[1]
RESULTS = HERE / "benchmarks" / "results"


def run_one(tree: Path, op: str, evals: int, workers: str, out: Path) -> list[dict]:
    """One `bench_scaleout.py` run of `tree`: its rows (one per worker count)."""
    cmd = [sys.executable, str(tree / "benchmarks" / "bench_scaleout.py"), "--device", "cpu", "--op", op,
           "--evals", str(evals), "--gpus", workers, "--out", str(out)]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"bench_scaleout.py failed in {tree} ({op}): {tail[0]}")
    return json.loads(out.read_text())["runs"]


def summarize(runs: list[dict]) -> list[dict]:
    """Per (op, workers): both sides' evaluations an hour per round, their medians and the ratio of the medians."""
    rows = []
    for op in dict.fromkeys(r["op"] for r in runs):
        for n in sorted({row["gpus"] for r in runs if r["op"] == op for row in r["rows"]}):
            side = {}
            for name in ("base", "tree"):
                side[name] = [row["evals_per_hour"] for r in runs if r["op"] == op and r["side"] == name
                              for row in r["rows"] if row["gpus"] == n and row.get("evals_per_hour")]
            b, t = (statistics.median(side[k]) if side[k] else None for k in ("base", "tree"))
            rows.append({"op": op, "workers": n, "base": side["base"], "tree": side["tree"], "base_median": b,
                         "tree_median": t, "ratio": round(t / b, 2) if b and t else None})
    return rows


def write(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Evaluations per hour, this tree beside {doc['base_commit']} ({doc['env'].get('device')}, torch "
             f"{doc['env'].get('torch')}, triton {doc['env'].get('triton')})", "", f"`{doc['command']}`", "",
             f"This tree: {doc['tree_commit']}. {doc['rounds']} rounds, the order of the two alternating; each cell's "
             "figure is the median over rounds (every round's figure in brackets).", "",
             "| op (evaluations) | workers | base | this tree | ratio |", "|---|---|---|---|---|"]
    def cell(median: float | None, values: list[float]) -> str:
        return "–" if median is None else f"{median:,.0f} ({', '.join(f'{v:,.0f}' for v in values)})"

    for r in doc["summary"]:
        ratio = "–" if r["ratio"] is None else f"**{r['ratio']}×**"
        lines.append(f"| {r['op']} ({doc['evals'][r['op']]}) | {r['workers']} | {cell(r['base_median'], r['base'])} | "
                     f"{cell(r['tree_median'], r['tree'])} | {ratio} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def commit_of(tree: Path) -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the checkout to compare against (a git worktree)")
    p.add_argument("--ops", default="linear:24,attention:8,rmsnorm:48", help="op:evaluations, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--out", type=Path, default=RESULTS / "scaleout_cpu_side.json")
    args = p.parse_args(argv)
    base = args.base.resolve()
    if not (base / "benchmarks" / "bench_scaleout.py").is_file():
        print(f"bench_scaleout_side: error: {base} has no benchmarks/bench_scaleout.py", file=sys.stderr)
        return 2
    try:
        evals = {op: int(n) for op, _, n in (item.partition(":") for item in args.ops.split(","))}
    except ValueError:
        print(f"bench_scaleout_side: error: --ops takes op:evaluations pairs, not {args.ops!r}", file=sys.stderr)
        return 2
    from benchmarks.harness import environment

    doc = {"bench": "scaleout_side", "base": str(base), "base_commit": commit_of(base), "tree_commit": commit_of(HERE),
           "evals": evals, "rounds": args.rounds, "workers": args.workers, "env": environment("cpu"),
           "command": " ".join(["python", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "runs": []}
    scratch = Path(tempfile.mkdtemp(prefix="tik-side-"))
    for k in range(args.rounds):
        for op, n in evals.items():
            order = (("base", base), ("tree", HERE)) if k % 2 == 0 else (("tree", HERE), ("base", base))
            for name, tree in order:
                print(f"side: round {k + 1}, {op}, {name} ...", file=sys.stderr, flush=True)
                rows = run_one(tree, op, n, args.workers, scratch / f"{name}_{op}_{k}.json")
                doc["runs"].append({"round": k + 1, "op": op, "side": name, "rows": rows})
                doc["summary"] = summarize(doc["runs"])
                write(doc, args.out)  # after every run: an interrupted comparison keeps what it measured
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
