"""`tik e2e`: a rollout + GRPO training step on a small model, three modes side by side."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from tik_tui.cli.common import TikError, common_parent, nonneg_int, positive_int, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("e2e", parents=[common_parent()], help="rollout + training step: log-prob equality, throughput",
                       description="Run rollout + GRPO steps in modes A (stock, recompute), C (unified, recompute) "
                                   "and B (unified, reuse rollout log-probs); report bitwise equality and time.")
    p.add_argument("--model", default="tiny", help="model preset: tiny, small, qwen3-0.6b, qwen3-1.7b (default tiny; "
                                                   "the qwen3 shapes at full depth, 28 layers)")
    p.add_argument("--checkpoint", help="a local Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--layers", type=positive_int, help="override the number of decoder layers")
    p.add_argument("--modes", help="comma-separated modes (default A,C,B on cuda; A,B on cpu, where the unified "
                                    "kernels run in Triton's interpreter)")
    p.add_argument("--steps", type=positive_int, help="timed steps per mode (default 2 on cuda, 1 on cpu)")
    p.add_argument("--warmup", type=nonneg_int, default=None, help="untimed steps first (default: 1 on cuda, 0 on cpu)")
    p.add_argument("--prompts", type=positive_int, help="prompts per step (default 4 on cuda, 2 on cpu)")
    p.add_argument("--group", type=positive_int, help="samples per prompt (default 4)")
    p.add_argument("--ppo-epochs", type=positive_int, default=None,
                   help="passes over each rollout batch (default 2)")
    p.add_argument("--minibatches", type=positive_int, default=None,
                   help="updates per pass, each on a minibatch of whole sequences (default 1); with more than one "
                        "the ratio moves within a pass")
    p.add_argument("--reward", choices=["copy", "parity"], default="copy",
                   help="copy: repeat the prompt's last token (learnable from scratch by a small model); parity: even "
                        "token ids, a signal from the first step at any vocabulary (a random qwen3-shaped model never "
                        "earns the copy reward, so its updates would move nothing)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when present")
    p.add_argument("--eager-decode", action="store_true",
                   help="launch every decode kernel from Python (default on cuda: replay CUDA graphs)")
    p.add_argument("--stock-eager", action="store_true",
                   help="mode A's norms, rope, softmax rows as eager PyTorch chains (default on cuda: torch.compile)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import tik_kernels  # noqa: F401  (sets the interpreter up before triton loads)
    from tik_kernels.e2e.run import CLI_DEFAULTS, MODES, E2EConfig, run_e2e
    from tik_kernels.e2e.safetensors_io import CheckpointError

    if args.device == "cuda" and not torch.cuda.is_available():
        raise TikError("--device cuda: no CUDA GPU on this machine")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    d = CLI_DEFAULTS["cuda" if device == "cuda" else "cpu"]
    modes = d["modes"] if args.modes is None else tuple(m.strip().upper() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise TikError(f"unknown mode {','.join(bad) or '(none)'}: choose from A, B, C")
    steps = args.steps or d["steps"]
    warmup = args.warmup if args.warmup is not None else (1 if device == "cuda" else 0)
    cfg = E2EConfig(preset=args.model, layers=args.layers, modes=modes, steps=steps, warmup=warmup,
                    prompts=args.prompts or d["prompts"], group=args.group or d["group"], prompt_len=d["prompt_len"],
                    answer_len=d["answer_len"], prefill_tokens=d.get("prefill_tokens", E2EConfig.prefill_tokens),
                    ppo_epochs=args.ppo_epochs or E2EConfig.ppo_epochs,
                    minibatches=args.minibatches or E2EConfig.minibatches,
                    device=device, seed=args.seed, checkpoint=args.checkpoint, reward=args.reward,
                    graphs=False if args.eager_decode or device != "cuda" else None,
                    stock_compiled=False if args.stock_eager or device != "cuda" else None)
    from tik_tui.cli.charts import stacked_bars

    line = ProgressLine(sys.stderr)
    try:
        out = run_e2e(cfg, on_progress=line.update)
    except (CheckpointError, ValueError) as e:
        raise TikError(str(e)) from None
    except torch.OutOfMemoryError:
        raise TikError(out_of_memory(line.ev, device)) from None
    finally:
        line.close()
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
    graphed = {k: r for k, r in out["modes"].items() if r.get("decode_graphs")}
    if graphed:
        print("decode steps replayed as CUDA graphs (" + ", ".join(
            f"{k}: {r['graphs_captured']} captured in {r['graph_capture_s']:.1f} s" for k, r in graphed.items())
              + "; captures are not in the step times)")
    shared: dict[tuple, list[str]] = {}  # a group's prompt prefilled once (the engine's share_prompts)
    for k, r in out["modes"].items():
        if r.get("shared_prompts"):
            shared.setdefault((r["prefill_tokens"], r["shared_prompts"]), []).append(k)
    for (computed, copies), modes in shared.items():
        who = "1 request" if copies == 1 else f"{copies} requests"
        print(f"prefill ({', '.join(modes)}): {computed} prompt tokens computed; {who} took a copy of their group's "
              f"prompt")
    peaks = {k: r["peak_gpu_bytes"] for k, r in out["modes"].items() if r.get("peak_gpu_bytes")}
    if peaks:
        print("peak GPU memory: " + ", ".join(f"{k} {b / 2**30:.1f} GiB" for k, b in peaks.items()))
    for k, r in out["modes"].items():
        if r.get("graph_error"):
            print(f"mode {k}: decode steps ran eagerly, a capture failed: {r['graph_error']}")
        if r.get("stock_attention"):  # which stock attention ran over the packed sequences, and why not the other
            print(f"mode {k}: packed attention {r['stock_attention']}")
    for k, v in out["speedup"].items():
        # a time ratio, like every ratio TIK prints (the run reports steps/s over steps/s)
        new, _, ref = k.partition("_over_")
        print(f"{new}: {1 / v:.3f}× {ref}'s time per step ({v:.3f}× its steps/s)" if v else f"{k}: -")
    print("\ntime per step by phase:")
    for bar in stacked_bars([(k, {p: r["time_s"][p] / max(1, steps) for p in ("rollout", "recompute", "train")})
                              for k, r in out["modes"].items()]):
        print(bar)
    if device == "cpu":
        print("(cpu: Triton interpreter; equality is meaningful, times are not)")
    return 0


def out_of_memory(ev: dict | None, device: str) -> str:
    """The one line for a run that ran out of GPU memory: where (the last progress event), how much the card has,
    and what makes a step smaller."""
    import torch

    where = f"mode {ev['mode']} ran out of GPU memory in its {ev['phase']} phase (step {ev['step']})" if ev else \
        "ran out of GPU memory"
    size = ""
    if device == "cuda" and torch.cuda.is_available():
        gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        size = f" on {torch.cuda.get_device_name()} ({gib:.0f} GiB)"
    return (f"{where}{size}: smaller steps need less (--minibatches N: N updates a pass, each on 1/N of the "
            "batch; --prompts, --group: a smaller batch; --layers: fewer layers), or run the modes one at a time "
            "(--modes)")


class ProgressLine:
    """Where the run has got to, on `stream` (stderr): `mode B  step 1/2  rollout  34 tokens  2.4 tok/s  14 s`.
    On a terminal one line, rewritten in place on every event (at most 10 times a second) and once a second in
    between (a Triton-interpreter kernel can run for seconds); otherwise (a log, a pipe) one plain line per
    finished phase, so a log shows the whole run without a line per decode step."""

    def __init__(self, stream, tty: bool | None = None, tick_s: float = 1.0):
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.last_write = 0.0
        self.ev: dict | None = None
        self.ev_at = 0.0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker = None
        if self.tty:
            self.ticker = threading.Thread(target=self._tick, args=(tick_s,), daemon=True)
            self.ticker.start()

    @staticmethod
    def text(ev: dict) -> str:
        rate = ev["tokens"] / ev["seconds"] if ev["seconds"] > 0 else 0.0
        return (f"tik e2e: mode {ev['mode']}  step {ev['step']}/{ev['steps']}  {ev['phase']:<9} "
                f"{ev['tokens']:>6} tokens  {rate:>8.1f} tok/s  {ev['seconds']:6.1f} s")

    def _write(self, ev: dict) -> None:
        self.stream.write("\r\033[K" + self.text(ev))
        self.stream.flush()
        self.last_write = time.monotonic()

    def _tick(self, every: float) -> None:
        while not self.stop.wait(every):
            with self.lock:
                if self.ev is not None and time.monotonic() - self.last_write >= every:
                    self._write(self.ev | {"seconds": self.ev["seconds"] + time.monotonic() - self.ev_at})

    def update(self, ev: dict) -> None:
        with self.lock:
            self.ev, self.ev_at = ev, time.monotonic()  # also where a failure happened (`out_of_memory`)
            if not self.tty:
                if ev["done"]:
                    self.stream.write(self.text(ev) + "\n")
                    self.stream.flush()
                return
            if ev["done"] or self.ev_at - self.last_write >= 0.1:
                self._write(ev)

    def close(self) -> None:
        self.stop.set()
        if self.ticker:
            self.ticker.join()
        if self.tty and self.ev is not None:
            self.stream.write("\r\033[K")
            self.stream.flush()
