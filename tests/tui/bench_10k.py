"""The UI on a workspace of 10,000 derivations: time to first paint, to expand the largest tree
and to scroll it. Writes benchmarks/results/tui_10k.json and .md.

    python tests/tui/bench_10k.py [--n 10000] [--keep DIR]

The workspace is built through the store API (git commits and rows, like a real search):
three operators, 60% of the derivations under rmsnorm; parents drawn at random among earlier
verified nodes, so the tree is both deep and bushy. Medians over `--reps` fresh app starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from tui_support import SRC, report  # noqa: E402

from tik_store import Workspace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def build(path: Path, n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    ops = {"rmsnorm": 0.6, "linear": 0.3, "logprob": 0.1}
    t0 = time.perf_counter()
    with Workspace.init(path) as ws:
        alive: dict[str, list[int]] = {}
        for op in ops:
            ws.ensure_operator(op, op, {}, f"fp-{op}")
            root = ws.add_implementation(op, SRC.format(block=128, warps=4) + f"# {op}\n", proposer="library",
                                         status="verified")
            ws.record_evaluation(root, report(True))
            alive[op] = [root]
        for k in range(n - len(ops)):
            op = rng.choices(list(ops), weights=list(ops.values()))[0]
            parent = rng.choice(alive[op][-50:]) if rng.random() < 0.7 else rng.choice(alive[op])
            i = ws.add_implementation(op, SRC.format(block=2 ** (4 + k % 8), warps=4) + f"# {op} {k}\n",
                                      parents=[parent], proposer="tuner", rationale=f"step {k}")
            r = rng.random()
            if r < 0.3:
                ws.record_evaluation(i, report(False, fail_check="batch_invariance"))
            else:
                ratios = tuple(rng.uniform(0.8, 1.1) for _ in range(3))
                ws.record_evaluation(i, report(True, eligible=r > 0.97, ratios=ratios))
                alive[op].append(i)
    return {"build_s": time.perf_counter() - t0}


async def one_run(path: Path) -> dict:
    from tik_tui.app import TikApp
    from tik_tui.config import UiConfig
    from tik_tui.widgets.derivation_tree import DerivationTree

    app = TikApp(path, config=UiConfig(poll_interval=1.0), poll=False)
    t0 = time.perf_counter()
    async with app.run_test(size=(100, 30)) as pilot:
        while not app.loaded:
            await pilot.pause(0.01)
        await pilot.pause()
        first_paint = time.perf_counter() - t0
        await pilot.press("2")
        tree = app.screen.query_one(DerivationTree)
        op = max(app.snapshot.op_names, key=lambda o: sum(1 for r in app.snapshot.impls.values() if r["op"] == o))
        tree.move_cursor(tree._op_nodes[op])
        t1 = time.perf_counter()
        await pilot.press("e")
        await pilot.pause()
        expand = time.perf_counter() - t1
        t2 = time.perf_counter()
        for _ in range(20):
            await pilot.press("pagedown")
        await pilot.pause()
        scroll = (time.perf_counter() - t2) / 20
        t3 = time.perf_counter()
        await pilot.press("4")
        await pilot.pause()
        history = time.perf_counter() - t3
        nodes = len(tree._impl_nodes)
    return {"first_paint_s": first_paint, "expand_largest_s": expand, "pagedown_s": scroll,
            "history_tab_s": history, "tree_nodes_shown": nodes, "largest_op": op}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="build (or reuse) the workspace here")
    args = ap.parse_args()
    path = args.keep or Path(tempfile.mkdtemp()) / "ws"
    out = ROOT / "benchmarks" / "results"
    built = {"build_s": None}
    if (out / "tui_10k.json").exists():  # a reused workspace keeps the build time measured with it
        built["build_s"] = json.loads((out / "tui_10k.json").read_text()).get("build_s")
    if not (path / "tik.db").exists():
        built = build(path, args.n)
    runs = [asyncio.run(one_run(path)) for _ in range(args.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}
    import textual

    doc = {"derivations": args.n, "reps": args.reps, "median": med, "runs": runs, **built,
           "env": {"python": platform.python_version(), "textual": textual.__version__,
                   "machine": platform.machine(), "cpus": __import__("os").cpu_count()},
           "note": "headless (App.run_test) on a shared CPU machine; first paint = app start to the first "
                   "snapshot drawn (store read on the store thread included)"}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tui_10k.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# TUI on {args.n} derivations (medians of {args.reps} app starts)", "",
             "| what | seconds |", "|---|---|"]
    lines += [f"| {k.removesuffix('_s').replace('_', ' ')} | {v:.3f} |" for k, v in med.items()]
    lines += ["", f"largest tree: {runs[0]['largest_op']}, {runs[0]['tree_nodes_shown']} nodes shown after expand-all",
              f"env: {doc['env']}", doc["note"]]
    (out / "tui_10k.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
