"""GPU end-to-end figures (issues 8 and 19), all in one run (medians; every ratio within the run):

1. throughput: bitwise log-prob equality and steps/s of modes A / C / B on the model shapes at full depth
   (`--layers N` to cut), the time split rollout / recompute / train, decode steps replayed as CUDA graphs;
2. decode: one rollout-engine decode step (qwen3-0.6b, 64 sequences) against the weight + KV bandwidth floor,
   stock and unified, graphs and eager;
3. learning: GRPO from scratch on the synthetic task over several seeds, modes A and B: reward curves with
   their spread (CSV + PNG);
4. layers: isolated-layer profiling, one decoder layer per shape, prefill / decode / train phases, stock vs
   the unified root kernels (vs given incumbent files with --impl-dir).

    PYTHONPATH=. python benchmarks/bench_e2e.py --out benchmarks/results
    PYTHONPATH=. python benchmarks/bench_e2e.py --only decode --out benchmarks/results
    PYTHONPATH=. python benchmarks/bench_e2e.py --only learning --device cpu --learn-preset tiny --learn-steps 3 \
        --learn-modes A --out /tmp/e2e   # the learning command's code path on a CPU

Results: <out>/e2e_h200_<parts>_full.json (`_layers<N>` instead of `_full` for a cut run; `learning_seeds` for the
learning part), e2e_learning_seeds.csv / .png. A full GPU run of a part also writes its keys of the card's
summary, <out>/summary_<card>.json (summary_h200.json holds the issues' figures): e2e_B_over_C (paired: B and C's
identical rollout and train phases averaged, only the recompute differing, `tik_kernels.e2e.run.speedups`),
e2e_B_over_C_unpaired and e2e_B_over_A (throughput, qwen3-1.7b at full depth; steps/s over steps/s, higher is better)
and e2e_decode_floor_ratio (decode, unified kernels with graphs: the time of a step waited for, inputs copied in and
tokens read back, over the floor at the H200's copy bandwidth, lower is better; e2e_decode_card_floor_ratio the same
over the floor at the run's card's own copy bandwidth, measured in the run: `card_tbps` in the file;
e2e_decode_queued_floor_ratio a step as the rollout's `generate` runs it, queued behind the one before with nothing
read back, over the H200's floor).
`--summarize FILE` writes a saved throughput file's keys (into the summary of the card that file was measured on).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tik_kernels  # noqa: E402,F401
from benchmarks import harness as H  # noqa: E402
from tik_kernels.e2e.backends import (  # noqa: E402
    NO_PDL_CONFIG,
    PDL_PREFETCH_CONFIG,
    StockBackend,
    UnifiedBackend,
    config_overrides,
    make_backend,
)
from tik_kernels.e2e.decode_bench import DecodeTimer  # noqa: E402
from tik_kernels.e2e.model import PRESETS, init_params  # noqa: E402
from tik_kernels.e2e.profile import profile_layer  # noqa: E402
from tik_kernels.e2e.run import E2EConfig, run_e2e, speedups  # noqa: E402
from tik_kernels.e2e.task import REWARDS  # noqa: E402


def throughput(args, out: Path) -> dict:
    res = {}
    for preset in args.shapes:
        cfg = E2EConfig(preset=preset, modes=tuple(args.modes), layers=args.layers, steps=args.steps, warmup=1,
                        prompts=args.prompts,
                        group=args.group, prompt_len=(32, 192), answer_len=(16, 96), max_slots=args.max_slots,
                        ppo_epochs=args.ppo_epochs, minibatches=args.minibatches, device=args.device,
                        graphs=False if args.eager_decode else None, reward=args.reward,
                        stock_compiled=False if args.stock_eager else None, share_prompts=not args.no_share_prompts)
        # the whole run once first, thrown away: the first mode run in a process paid the process's one-time costs
        # (cuBLAS/SDPA initialisation, Triton compiles, the allocator's growth) inside its measured steps. One step of
        # each mode was not enough: every step draws a new batch, whose shapes (packed lengths, minibatches, decode
        # buckets) the first mode then met first in its timed steps (the likely cause, not shown, of mode C's train
        # phase taking 4.68 s against mode B's 2.44 s for the same work: H100, minibatch setting,
        # e2e_h100_minibatch_qwen3-1.7b_s22.json). The same seed gives the same batches, so the timed run meets only
        # shapes the thrown-away run has compiled.
        t = time.time()
        run_e2e(cfg)
        warm_s = time.time() - t
        t = time.time()
        r = run_e2e(cfg)
        r["wall_s"], r["discarded_warm_run_s"] = time.time() - t, warm_s
        for m in r["modes"].values():
            m.pop("rewards", None)
        res[preset] = r
        print(json.dumps({preset: {k: {kk: m[kk] for kk in ("equal_tokens", "tokens", "max_abs_dlogp", "steps_per_s",
                                                              "time_s", "peak_gpu_bytes") if kk in m}
                                   for k, m in r["modes"].items()}
                          | {"speedup": r["speedup"]}}), flush=True)
    return res


#: `--decode-backends`, beside `stock` and `unified` (each in the same run, with the same bits):
#: `unified-s18` the unified decode step as it was before sessions 19 and 20 (separate rope, scatters and q / k norms;
#: no NARROW_PCT; split decode merged by its combine kernel; the long-context decode launch at every length; no
#: programmatic dependent launch; the token and its log-prob from sample_logprob's one pass);
#: `unified-nopdl` today's step without programmatic dependent launch; `unified-pdl-prefetch` with the linear's weight
#: prefetch too; `unified-fused-lmhead` with sample_logprob's one pass instead of sample then logprob (the default
#: since session 25: the same as `unified`); `unified-two-pass-lmhead` with sample then logprob (as until then);
#: `stock-s19` mode A with session 19's cache fill inside its compiled rope and its folded-GQA attention;
#: `stock-dynamic` mode A with its compositions compiled for symbolic shapes from the first call (as until session 21);
#: `unified-qk-rope` with the q / k norms, rope and cache fill in one launch (`UnifiedBackend(fused_qk_rope=True)`, the
#: default since session 22: the same as `unified`); `unified-two-qk-launches` with them in two (as until then);
#: `unified-qk-regs` with that launch's rope reading the normed halves from registers (rmsnorm's ROPE_REGS);
#: `unified-fused-mlp` with the MLP's gate_up projection and silu_mul in one launch (`UnifiedBackend(fused_mlp=True)`,
#: linear's `linear_silu_mul`; off by default: session 32's row-pair launch was no faster on an H100, the
#: two-accumulator launch of session 37 not yet timed);
#: `unified-narrow512`, `unified-narrow1024` with linear's narrow-output rule on (a weight of at most 2048 rows
#: reduces K in chunks of 512 / 1024: new bits for the o and down projections of qwen3-0.6b and 1.7b;
#: tik_kernels/ops/linear.py); `stock-scatter` mode A with its KV-cache fill as two scatters after its compiled rope
#: (mode A until session 23), `stock-fill-rows` as row copies (`StockBackend(fill_rows=True)`), `stock-fill-compiled`
#: inside its compiled rope (mode A's default since session 23: the same as `stock`), `stock-fold-gqa` the scatters
#: with folded-GQA attention (session 19's two changes one at a time).
#: Each: (the backend, given whether stock compositions are compiled; the CONFIG overrides of its run)
S18_CUTS = {"linear": {"NARROW_PCT": 0}, "attention": {"DECODE_FUSED_MAX_CHUNKS": 0, "DECODE_SHORT_KEYS": 0}}
S18_DECODE = {op: {**kv, **S18_CUTS.get(op, {})} for op, kv in NO_PDL_CONFIG.items()}
DECODE_VARIANTS = {
    "stock-s19": (lambda compiled: StockBackend(compiled=compiled, fill_in_compiled=True, fold_gqa=True), {}),
    "stock-dynamic": (lambda compiled: StockBackend(compiled=compiled, compile_dynamic=True), {}),
    "stock-scatter": (lambda compiled: StockBackend(compiled=compiled, fill_in_compiled=False), {}),
    "stock-fill-rows": (lambda compiled: StockBackend(compiled=compiled, fill_rows=True), {}),
    "stock-fill-compiled": (lambda compiled: StockBackend(compiled=compiled, fill_in_compiled=True), {}),
    "stock-fold-gqa": (lambda compiled: StockBackend(compiled=compiled, fill_in_compiled=False, fold_gqa=True), {}),
    "unified-s18": (lambda _: UnifiedBackend(fused_launches=False, fused_lmhead=True), S18_DECODE),
    "unified-nopdl": (lambda _: UnifiedBackend(), NO_PDL_CONFIG),
    "unified-pdl-prefetch": (lambda _: UnifiedBackend(), PDL_PREFETCH_CONFIG),
    "unified-fused-lmhead": (lambda _: UnifiedBackend(fused_lmhead=True), {}),
    "unified-two-pass-lmhead": (lambda _: UnifiedBackend(fused_lmhead=False), {}),
    "unified-qk-rope": (lambda _: UnifiedBackend(fused_qk_rope=True), {}),
    "unified-qk-regs": (lambda _: UnifiedBackend(), {"rmsnorm": {"ROPE_REGS": 1}}),
    "unified-two-qk-launches": (lambda _: UnifiedBackend(fused_qk_rope=False), {}),
    "unified-fused-mlp": (lambda _: UnifiedBackend(fused_mlp=True), {}),
    "unified-narrow512": (lambda _: UnifiedBackend(), {"linear": {"NARROW_N": 2048, "NARROW_KCHUNK": 512}}),
    "unified-narrow1024": (lambda _: UnifiedBackend(), {"linear": {"NARROW_N": 2048, "NARROW_KCHUNK": 1024}}),
}


def decode(args) -> dict:
    """The engine's decode step vs the bandwidth floor: every backend, graphs and eager (graphs only on CUDA). At each
    context and mode every contender is built and captured first, then timed a round at a time, interleaved (the
    order rotating round by round), medians over the rounds."""
    res = {"preset": args.decode_preset, "layers": args.layers, "runs": []}
    mc = PRESETS[args.decode_preset]
    if args.layers:
        mc = mc.with_layers(args.layers)
    cuda = args.device == "cuda"
    params = init_params(mc, 0, args.device)
    contenders = []  # (name, the backend given whether stock compositions are compiled, CONFIG overrides)
    for name in args.decode_backends:
        if name in DECODE_VARIANTS:
            contenders.append((name, *DECODE_VARIANTS[name]))
        else:
            contenders.append((name, lambda compiled, name=name: make_backend(name, stock_compiled=compiled), {}))
    contenders += [(f"unified:{name}", lambda _: UnifiedBackend(), over) for name, over in args.decode_variant]
    reps = args.decode_reps if cuda else 1
    rounds = args.decode_rounds or (5 if cuda else 1)
    # the floor at this card's own copy bandwidth beside the issue's (at the H200's, H.COPY_TBPS)
    res["card_tbps"] = card_tbps = H.measure_copy_tbps(args.device)
    for context in args.decode_context:
        for graphs in ((True, False) if cuda else (False,)):
            runs: list[dict] = []
            timers = []  # (its run, its CONFIG overrides, its timer)
            for name, make, over in contenders:
                run = {"backend": name, "graphs": graphs, "batch": args.decode_batch, "context": context}
                runs.append(run)
                try:
                    be = make(cuda and not args.stock_eager)
                    run["stock_compiled"] = getattr(be, "compiled", None)
                    with config_overrides(over):  # a CUDA graph keeps the launches of its capture
                        timers.append((run, over, DecodeTimer(mc, be, batch=args.decode_batch, context=context,
                                                              graphs=graphs, device=args.device, tbps=H.COPY_TBPS,
                                                              params=params)))
                except RuntimeError as e:  # one failed contender does not lose the others' figures
                    run["error"] = H.one_line(e)
            n = len(timers)
            for k in range(rounds):
                for run, over, timer in (timers[k % n:] + timers[:k % n]) if n else ():
                    if "error" in run:
                        continue
                    try:
                        with config_overrides(over):  # eager launches read the CONFIG at each call
                            timer.round(reps)
                    except RuntimeError as e:
                        run["error"] = H.one_line(e)
            for run, _, timer in timers:
                if "error" not in run:
                    run |= timer.result() | {"backend": run["backend"]}
                    if card_tbps:
                        run |= card_floor(run, card_tbps)
            del timers
            for r in runs:
                res["runs"].append(r)
                print(json.dumps({k: r[k] for k in ("backend", "graphs", "batch", "context", "step_ms", "floor_ms",
                                                    "step_over_floor", "overlap_over_floor", "replay_over_floor",
                                                    "card_tbps", "step_over_card_floor", "replay_over_card_floor",
                                                    "host_launch_ms", "replay_host_ms",
                                                    "error") if k in r}), flush=True)
    return res


def card_floor(run: dict, card_tbps: float) -> dict:
    """A decode run's floor at this card's measured copy bandwidth, and its times over it."""
    floor_ms = run["floor_ms"] * run["tbps"] / card_tbps
    out = {"card_tbps": card_tbps, "card_floor_ms": floor_ms, "step_over_card_floor": run["step_ms"] / floor_ms}
    if "replay_ms" in run:
        out["replay_over_card_floor"] = run["replay_ms"] / floor_ms
    return out


def _seed_stats(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Per step: mean, min and max over seeds."""
    cols = list(zip(*curves, strict=True))
    return [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def learning(args, out: Path) -> dict:
    """GRPO from scratch for every seed and mode; rewards per step with the mean and the min-max band over seeds. The
    CSV, the PNG and the summary are written again after each seed, so a run cut short keeps the seeds it finished."""
    modes = tuple(args.learn_modes)
    curves: dict[str, list[list[float]]] = {m: [] for m in modes}
    equal = {m: [] for m in modes}
    summary: dict = {}
    for seed in args.seeds:
        cfg = E2EConfig(preset=args.learn_preset, modes=modes, steps=args.learn_steps, prompts=args.learn_prompts,
                        group=args.learn_group, prompt_len=(3, 9), answer_len=(4, 8), max_slots=128, lr=args.lr,
                        ppo_epochs=args.ppo_epochs, minibatches=args.minibatches,
                        seed=seed, device=args.device)
        r = run_e2e(cfg)
        for m, v in r["modes"].items():
            curves[m].append(v["rewards"])
            equal[m].append(v["equal_frac"])
        print(json.dumps({"seed": seed, "final_reward": {m: v["rewards"][-1] for m, v in r["modes"].items()}}),
              flush=True)
        done = args.seeds[:len(curves[modes[0]])]
        summary = _learning_files(args, out, modes, done, curves, equal)
    print(json.dumps({"learning": {k: v for k, v in summary.items() if k != "curves"}}), flush=True)
    return summary


def _learning_files(args, out: Path, modes: tuple[str, ...], seeds: list[int], curves: dict[str, list[list[float]]],
                    equal: dict[str, list[float]]) -> dict:
    """The learning part's CSV and PNG for the seeds done so far, and its summary."""
    stats = {m: _seed_stats(c) for m, c in curves.items()}
    with open(out / "e2e_learning_seeds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"{m}_{k}" for m in modes for k in ("mean", "min", "max")]
                   + [f"{m}_seed{s}" for m in modes for s in seeds])
        for i in range(args.learn_steps):
            w.writerow([i] + [f"{stats[m][j][i]:.4f}" for m in modes for j in range(3)]
                       + [f"{c[i]:.4f}" for m in modes for c in curves[m]])
    png = out / "e2e_learning_seeds.png"
    label = {"A": "A: stock kernels, recompute", "B": "B: unified kernels, reuse rollout log-probs",
             "C": "C: unified kernels, recompute"}
    how = plot_bands(png, {label[m]: stats[m] for m in modes}, xlabel="GRPO step", ylabel="mean reward",
                     title=f"GRPO from scratch, {len(seeds)} seeds (mean, min-max band)")
    tail = max(1, args.learn_steps // 5)
    return {"steps": args.learn_steps, "seeds": list(seeds), "preset": args.learn_preset, "png": how,
            "first_mean_reward": {m: sum(stats[m][0][:tail]) / tail for m in modes},
            "final_mean_reward": {m: sum(stats[m][0][-tail:]) / tail for m in modes},
            "final_reward_per_seed": {m: [sum(c[-tail:]) / tail for c in curves[m]] for m in modes},
            "equal_frac": equal, "curves": curves}


def plot_bands(path: Path, series: dict[str, tuple[list[float], list[float], list[float]]], *, xlabel: str,
               ylabel: str, title: str) -> str:
    """A PNG of each series' mean line over its min-max band: matplotlib where installed, else a plain raster
    (lines and bands, no text; the CSV beside it has the numbers). Returns which one was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_band_png(path, list(series.values()))
        return "plain (matplotlib missing: no labels)"
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (mean, lo, hi) in series.items():
        xs = list(range(len(mean)))
        (line,) = ax.plot(xs, mean, label=name)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return "matplotlib"


def write_band_png(path: Path, series: list[tuple[list[float], list[float], list[float]]], w: int = 640,
                   h: int = 360) -> None:
    """Mean lines over shaded min-max bands as an RGB PNG, with the standard library only."""
    import struct
    import zlib

    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44)]
    px = bytearray(b"\xff" * (w * h * 3))
    lo_all = min((min(s[1]) for s in series if s[1]), default=0.0)
    hi_all = max((max(s[2]) for s in series if s[2]), default=1.0)
    span = (hi_all - lo_all) or 1.0
    m = 20

    def y_of(v: float) -> int:
        return h - 1 - m - round((v - lo_all) / span * (h - 2 * m))

    def put(x: int, y: int, c) -> None:
        if 0 <= x < w and 0 <= y < h:
            px[(y * w + x) * 3 : (y * w + x) * 3 + 3] = bytes(c)

    def x_of(k: int, n: int) -> int:
        return m + round(k / max(1, n - 1) * (w - 2 * m - 1))

    def at(a: list[float], x: int) -> float:
        """The series interpolated at pixel column x."""
        n = len(a)
        k = (x - m) / max(1, w - 2 * m - 1) * max(1, n - 1)
        j = min(int(k), max(0, n - 2))
        f = k - j if n > 1 else 0.0
        return a[j] * (1 - f) + a[min(j + 1, n - 1)] * f

    for i, (mean, lo, hi) in enumerate(series):
        c = colours[i % len(colours)]
        light = tuple(255 - (255 - v) // 4 for v in c)
        for x in range(m, w - m):
            for y in range(y_of(at(hi, x)), y_of(at(lo, x)) + 1):
                put(x, y, light)
        n = len(mean)
        for k in range(n - 1):  # the mean, segment by segment
            x0, y0, x1, y1 = x_of(k, n), y_of(mean[k]), x_of(k + 1, n), y_of(mean[k + 1])
            steps = max(abs(x1 - x0), abs(y1 - y0), 1)
            for t in range(steps + 1):
                put(x0 + round((x1 - x0) * t / steps), y0 + round((y1 - y0) * t / steps), c)
    for x in range(m, w - m):  # axes, over the bands
        put(x, h - 1 - m, (0, 0, 0))
    for y in range(m, h - m):
        put(m, y, (0, 0, 0))
    raw = b"".join(b"\x00" + bytes(px[y * w * 3 : (y + 1) * w * 3]) for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def layers(args) -> dict:
    res = {}
    impl = None
    if args.impl_dir:
        impl = {p.stem: p for p in Path(args.impl_dir).glob("*.py")}
    for preset in args.shapes:
        backends = {"stock": make_backend("stock"), "unified_root": make_backend("unified")}
        if impl:
            backends["unified_incumbent"] = make_backend("unified", impl)
        r = profile_layer(PRESETS[preset], backends, device=args.device, reps=args.reps)
        res[preset] = r
        print(json.dumps({preset: {k: v["sum_ms"] for k, v in r["backends"].items()}}), flush=True)
    return res


def summary_keys(part: str, doc: dict, args) -> dict:
    """The summary keys a full-depth GPU run of `part` gives (none for a cut or CPU run)."""
    if args.device != "cuda" or args.layers:
        return {}
    if part == "throughput" and "qwen3-1.7b" in doc and not doc["qwen3-1.7b"]["config"].get("layers"):
        sp = speedups(doc["qwen3-1.7b"]["modes"])  # from the modes' times: a file from before the paired ratio too
        # e2e_B_over_C is the paired ratio (B and C's identical rollout and train phases averaged, `speedups`); the
        # ratio of the two runs' steps/s, with their run-order noise, is kept beside it
        return {k: v for k, v in (("e2e_B_over_C", sp.get("B_over_C_paired")),
                                  ("e2e_B_over_C_unpaired", sp.get("B_over_C")),
                                  ("e2e_B_over_A", sp.get("B_over_A"))) if v is not None}
    if part == "decode" and doc["preset"] == "qwen3-0.6b":
        runs = [r for r in doc["runs"] if r["graphs"] and r["batch"] == 64 and "error" not in r]
        # each key: the worst context of a backend's figure (queued: the step as `generate` runs it, behind the one
        # before with nothing read back, `overlap_ms`, beside the waited-for step of the key)
        wanted = {"e2e_decode_floor_ratio": ("unified", "step_over_floor"),
                  "e2e_decode_floor_ratio_stock": ("stock", "step_over_floor"),
                  "e2e_decode_card_floor_ratio": ("unified", "step_over_card_floor"),
                  "e2e_decode_queued_floor_ratio": ("unified", "overlap_over_floor")}
        worst = {key: [r[fig] for r in runs if r["backend"] == be and fig in r] for key, (be, fig) in wanted.items()}
        return {key: max(v) for key, v in worst.items() if v}
    return {}


def main() -> int:
    from tik_tui.cli.common import positive_int

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-1.7b"], choices=list(PRESETS))
    ap.add_argument("--layers", type=positive_int, default=None,
                    help="cut the models to N layers (default: full depth)")
    ap.add_argument("--steps", type=positive_int, default=3)
    ap.add_argument("--prompts", type=positive_int, default=8)
    ap.add_argument("--group", type=positive_int, default=8)
    ap.add_argument("--max-slots", type=positive_int, default=64, help="throughput: the rollout engine's decode slots")
    ap.add_argument("--ppo-epochs", type=positive_int, default=E2EConfig.ppo_epochs,
                    help="throughput, learning: passes over each rollout batch")
    ap.add_argument("--minibatches", type=positive_int, default=E2EConfig.minibatches,
                    help="throughput, learning: updates per pass, each on a minibatch of whole sequences")
    ap.add_argument("--modes", nargs="+", default=list(E2EConfig.modes), choices=["A", "B", "C"],
                    help="throughput: the modes run, in this order (B/C needs B and C, B/A B and A)")
    ap.add_argument("--reward", default="parity", choices=list(REWARDS),
                    help="throughput: the reward (parity: signal from step one, so every update moves the policy; "
                         "copy: the learning task, whose reward a random model at a real vocabulary never earns)")
    ap.add_argument("--eager-decode", action="store_true", help="throughput: no CUDA graphs in the rollout")
    ap.add_argument("--no-share-prompts", action="store_true",
                    help="throughput: every request's prompt prefilled on its own, not once for its GRPO group")
    ap.add_argument("--stock-eager", action="store_true",
                    help="mode A / the stock decode step without torch.compile of its norms, rope and softmax rows")
    ap.add_argument("--decode-preset", default="qwen3-0.6b", choices=list(PRESETS))
    ap.add_argument("--decode-batch", type=positive_int, default=64)
    ap.add_argument("--decode-context", type=positive_int, nargs="+", default=[128, 256],
                    help="decode: every sequence's context length (default 128 256)")
    ap.add_argument("--decode-reps", type=positive_int, default=20)
    ap.add_argument("--decode-rounds", type=positive_int, default=None,
                    help="decode: interleaved rounds per contender (default 5 on CUDA, 1 on a CPU)")
    ap.add_argument("--decode-backends", nargs="+", default=["stock", "unified"],
                    choices=["stock", "unified", *DECODE_VARIANTS],
                    help="decode: beside stock and unified, the variants of DECODE_VARIANTS (unified-s18: the "
                         "unified step before sessions 19 and 20's cuts; stock-s19: mode A with session 19's changes)")
    ap.add_argument("--decode-variant", action="append", default=[], metavar="NAME=OP.KEY=VALUE[,...]",
                    type=lambda spec: H.parse_config_spec(spec, H.OPERATORS, "--decode-variant"),
                    help="decode: also the unified step with these CONFIG launch values, as backend unified:NAME "
                         "(repeatable; e.g. short2=attention.decode_short_num_stages=2)")
    ap.add_argument("--learn-steps", type=positive_int, default=120)
    ap.add_argument("--learn-preset", default="small", choices=list(PRESETS))
    ap.add_argument("--learn-modes", nargs="+", default=["A", "B"], choices=["A", "B", "C"])
    ap.add_argument("--learn-prompts", type=positive_int, default=16)
    ap.add_argument("--learn-group", type=positive_int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--reps", type=positive_int, default=10)
    ap.add_argument("--impl-dir", help="directory of incumbent implementation files (<op>.py)")
    parts = ["throughput", "decode", "learning", "layers"]
    ap.add_argument("--only", nargs="+", choices=parts, default=parts)
    ap.add_argument("--summarize", type=Path, metavar="FILE",
                    help="no run: the summary keys of a saved full-depth throughput file, written to <out>'s summary")
    args = ap.parse_args()
    if (err := H.unknown_config_keys(args.decode_variant, "--decode-variant")) is not None:
        ap.error(err)
    if args.summarize:
        try:
            saved = json.loads(args.summarize.read_text())
        except (OSError, ValueError) as e:
            ap.error(f"{args.summarize}: not a readable results file ({type(e).__name__}: {e})")
        if not isinstance(saved, dict):
            ap.error(f"{args.summarize}: not a bench_e2e results file (no JSON object)")
        args.device, args.layers = "cuda" if saved.get("gpu") else "cpu", None
        try:
            keys = summary_keys("throughput", saved.get("throughput", {}), args)
        except (KeyError, TypeError, AttributeError) as e:
            ap.error(f"{args.summarize}: not a bench_e2e throughput file (missing {e})")
        if not keys:
            ap.error(f"{args.summarize}: no full-depth GPU throughput run of qwen3-1.7b in it")
        args.out.mkdir(parents=True, exist_ok=True)
        H.update_summary(H.summary_path(args.out, H.gpu_tag(saved.get("gpu"))), keys, source=str(args.summarize))
        print(json.dumps(keys))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("no CUDA GPU here: pass --device cpu (the code path only; times mean nothing)")
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    env = H.environment()
    doc = {"gpu": env["gpu"], "torch": torch.__version__, "triton": env["triton"], "env": env,
           "command": H.command_line()}
    card = H.card_tag(args.device)
    prefix = f"e2e_{card}"
    full = args.only == parts
    # the multi-seed learning run has a name of its own: the single-seed run's file stays what the README cites
    label = {"learning": "learning_seeds"}
    name = f"{prefix}.json" if full else f"{prefix}_{'_'.join(label.get(p, p) for p in args.only)}.json"
    # full depth is another experiment than the earlier 4-layer runs: its own file, theirs kept
    name = name.replace(".json", f"_layers{args.layers}.json" if args.layers else "_full.json")
    for part, fn in (("layers", lambda: layers(args)), ("decode", lambda: decode(args)),
                     ("throughput", lambda: throughput(args, args.out)),
                     ("learning", lambda: learning(args, args.out))):
        if part in args.only:
            doc[part] = fn()
            H.write_json(args.out / name, doc)  # after every part: a cut run keeps its part
            keys = summary_keys(part, doc[part], args) if card != "cpu" else {}
            if keys:  # the card's own summary (summary_h200.json holds the issues' figures)
                H.update_summary(H.summary_path(args.out, card), keys, source=str(args.out / name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
