"""GPU end-to-end figures for issue 8, all in one run (medians; every ratio within the run):

1. bitwise log-prob equality and steps/s of modes A / C / B on two model shapes (reduced layers),
   the time split rollout / recompute / train;
2. learning: GRPO from scratch on the synthetic task, modes A and B, reward curves (CSV + PNG);
3. isolated-layer profiling: one decoder layer per shape, prefill / decode / train phases, stock
   vs the unified root kernels (vs given incumbent files with --impl-dir).

    PYTHONPATH=. python benchmarks/bench_e2e.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tik_kernels  # noqa: E402,F401
from benchmarks import harness as H  # noqa: E402
from tik_kernels.e2e.model import PRESETS, make_backend  # noqa: E402
from tik_kernels.e2e.profile import profile_layer  # noqa: E402
from tik_kernels.e2e.run import E2EConfig, run_e2e  # noqa: E402


def throughput(args, out: Path) -> dict:
    res = {}
    for preset in args.shapes:
        cfg = E2EConfig(preset=preset, layers=args.layers, steps=args.steps, warmup=1, prompts=args.prompts,
                        group=args.group, prompt_len=(32, 192), answer_len=(16, 96), max_slots=64, device="cuda")
        # one throw-away step of every mode first: the first mode run in a process paid the process's
        # one-time costs (cuBLAS/SDPA initialisation, Triton compiles) inside its measured steps
        t = time.time()
        run_e2e(dataclasses.replace(cfg, steps=1, warmup=0))
        warm_s = time.time() - t
        t = time.time()
        r = run_e2e(cfg)
        r["wall_s"], r["discarded_warm_run_s"] = time.time() - t, warm_s
        for m in r["modes"].values():
            m.pop("rewards", None)
        res[preset] = r
        print(json.dumps({preset: {k: {kk: m[kk] for kk in ("equal_tokens", "tokens", "max_abs_dlogp", "steps_per_s",
                                                              "time_s")} for k, m in r["modes"].items()}
                          | {"speedup": r["speedup"]}}), flush=True)
    return res


def learning(args, out: Path) -> dict:
    curves = {}
    cfg = E2EConfig(preset="small", modes=("A", "B"), steps=args.learn_steps, prompts=16, group=8,
                    prompt_len=(3, 9), answer_len=(4, 8), max_slots=128, lr=args.lr, device="cuda")
    r = run_e2e(cfg)
    for m, v in r["modes"].items():
        curves[m] = v["rewards"]
    with open(out / "e2e_learning.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "reward_A_stock_recompute", "reward_B_unified_reuse"])
        for i, (a, b) in enumerate(zip(curves["A"], curves["B"], strict=True)):
            w.writerow([i, f"{a:.4f}", f"{b:.4f}"])
    tail = max(1, len(curves["A"]) // 5)
    mean_a = sum(curves["A"][-tail:]) / tail
    mean_b = sum(curves["B"][-tail:]) / tail
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(curves["A"], label="A: stock kernels, recompute")
        ax.plot(curves["B"], label="B: unified kernels, reuse rollout log-probs")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("mean reward")
        ax.set_title("GRPO from scratch: repeat the prompt's last token")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "e2e_learning.png", dpi=120)
    except ImportError:
        print("matplotlib missing: no PNG", flush=True)
    summary = {"steps": args.learn_steps, "final_mean_reward": {"A": mean_a, "B": mean_b},
               "ratio_B_over_A": mean_b / mean_a if mean_a else None,
               "first_mean_reward": {m: sum(c[:tail]) / tail for m, c in curves.items()},
               "equal_frac": {m: v["equal_frac"] for m, v in r["modes"].items()}}
    print(json.dumps({"learning": summary}), flush=True)
    return summary


def layers(args) -> dict:
    res = {}
    impl = None
    if args.impl_dir:
        impl = {p.stem: p for p in Path(args.impl_dir).glob("*.py")}
    for preset in args.shapes:
        backends = {"stock": make_backend("stock"), "unified_root": make_backend("unified")}
        if impl:
            backends["unified_incumbent"] = make_backend("unified", impl)
        r = profile_layer(PRESETS[preset], backends, device="cuda", reps=args.reps)
        res[preset] = r
        print(json.dumps({preset: {k: v["sum_ms"] for k, v in r["backends"].items()}}), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-1.7b"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--learn-steps", type=int, default=120)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--impl-dir", help="directory of incumbent implementation files (<op>.py)")
    ap.add_argument("--only", nargs="+", choices=["throughput", "learning", "layers"],
                    default=["throughput", "learning", "layers"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    env = H.environment()
    doc = {"gpu": env["gpu"], "torch": torch.__version__, "triton": env["triton"], "env": env,
           "command": H.command_line()}
    full = args.only == ["throughput", "learning", "layers"]
    name = "e2e_h200.json" if full else f"e2e_h200_{'_'.join(args.only)}.json"
    for part, fn in (("layers", lambda: layers(args)), ("throughput", lambda: throughput(args, args.out)),
                     ("learning", lambda: learning(args, args.out))):
        if part in args.only:
            doc[part] = fn()
            H.write_json(args.out / name, doc)  # after every part: a cut run keeps its part
    return 0


if __name__ == "__main__":
    sys.exit(main())
