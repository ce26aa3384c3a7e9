"""`tik e2e`: a rollout + GRPO training step on a small model, three modes side by side."""

from __future__ import annotations

import argparse

from tik_tui.cli.common import TikError, common_parent, nonneg_int, positive_int, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("e2e", parents=[common_parent()], help="rollout + training step: log-prob equality, throughput",
                       description="Run rollout + GRPO steps in modes A (stock, recompute), C (unified, recompute) "
                                   "and B (unified, reuse rollout log-probs); report bitwise equality and time.")
    p.add_argument("--model", default="tiny", help="model preset: tiny, small, qwen3-0.6b, qwen3-1.7b (default tiny)")
    p.add_argument("--checkpoint", help="a local Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--layers", type=positive_int, help="override the number of decoder layers")
    p.add_argument("--modes", default="A,C,B", help="comma-separated modes (default A,C,B)")
    p.add_argument("--steps", type=positive_int, default=2, help="timed steps per mode (default 2)")
    p.add_argument("--warmup", type=nonneg_int, default=None, help="untimed steps first (default: 1 on cuda, 0 on cpu)")
    p.add_argument("--prompts", type=positive_int, default=4, help="prompts per step (default 4)")
    p.add_argument("--group", type=positive_int, default=4, help="samples per prompt (default 4)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when present")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import tik_kernels  # noqa: F401  (sets the interpreter up before triton loads)
    from tik_kernels.e2e.run import MODES, E2EConfig, run_e2e
    from tik_kernels.e2e.safetensors_io import CheckpointError

    modes = tuple(m.strip().upper() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise TikError(f"unknown mode {','.join(bad) or '(none)'}: choose from A, B, C")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise TikError("--device cuda: no CUDA GPU on this machine")
    if args.steps < 1:
        raise TikError("--steps must be at least 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    warmup = args.warmup if args.warmup is not None else (1 if device == "cuda" else 0)
    cfg = E2EConfig(preset=args.model, layers=args.layers, modes=modes, steps=args.steps, warmup=warmup,
                    prompts=args.prompts, group=args.group, device=device, seed=args.seed,
                    checkpoint=args.checkpoint)
    from tik_tui.cli.charts import progress, stacked_bars

    try:
        with progress(f"tik e2e: {args.model}, modes {','.join(modes)}, {args.steps} step(s) each on {device}") as note:
            out = run_e2e(cfg, on_step=lambda mode, step, *_: note(f"mode {mode}, step {step + 1} of "
                                                                     f"{warmup + args.steps} done"))
    except (CheckpointError, ValueError) as e:
        raise TikError(str(e)) from None
    if args.json:
        print_json(out)
        return 0
    m = out["model"]
    print(f"model {m['preset']}: {m['layers']} layers, hidden {m['hidden']}, {m['params'] / 1e6:.1f}M params "
          f"on {out.get('gpu', out['device'])}")
    print(f"{'mode':<5}{'kernels':<9}{'old logp':<11}{'equal':>14}{'max|Δlogp|':>12}{'steps/s':>9}"
          f"{'rollout':>9}{'recomp':>8}{'train':>8}")
    for k, r in out["modes"].items():
        t = r["time_s"]
        print(f"{k:<5}{r['backend']:<9}{'recompute' if r['recompute'] else 'reuse':<11}"
              f"{r['equal_tokens']:>7}/{r['tokens']:<6}{r['max_abs_dlogp']:>12.2e}{r['steps_per_s']:>9.2f}"
              f"{t['rollout']:>8.2f}s{t['recompute']:>7.2f}s{t['train']:>7.2f}s")
    for k, v in out["speedup"].items():
        # a time ratio, like every ratio TIK prints (the run reports steps/s over steps/s)
        new, _, ref = k.partition("_over_")
        print(f"{new}: {1 / v:.3f}× {ref}'s time per step ({v:.3f}× its steps/s)" if v else f"{k}: -")
    print("\ntime per step by phase:")
    for line in stacked_bars([(k, {p: r["time_s"][p] / max(1, args.steps) for p in ("rollout", "recompute", "train")})
                              for k, r in out["modes"].items()]):
        print(line)
    if device == "cpu":
        print("(cpu: Triton interpreter; equality is meaningful, times are not)")
    return 0
