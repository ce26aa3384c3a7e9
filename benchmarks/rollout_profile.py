"""Where a rollout's time goes: one `RolloutEngine.generate` of the e2e throughput batch, split by phase.

    PYTHONPATH=. python benchmarks/rollout_profile.py --preset qwen3-1.7b --backends unified stock \
        --out benchmarks/results --name rollout_profile_h200

The engine and batch are `bench_e2e.py --only throughput`'s (8 prompts x 8, prompts of 32-192 tokens, answers of
16-96, 64 slots). Two warm-up rollouts capture every decode bucket the batch meets. Then:
- the wall time of a rollout with the host running ahead of the device (`overlap`, the engine's default) and with
  every step read back before the next (`overlap=False`, the loop before it), interleaved over `--rounds` rounds,
  medians, and their ratio;
- the device-busy time of one rollout from torch.profiler's kernel records, so what the host adds shows as wall
  minus busy;
- one rollout with the engine's parts wrapped in timers that synchronize the device before and after each part
  (so nothing overlaps there): decode_replay, the decode step's graph replay (its launch and device time);
  decode_host, the rest of a step's launch (staging its inputs); prefill_forward, the packed prefill forward;
  loop_host_and_rest, everything else (sampling after a prefill, bookkeeping, retiring, KV compaction, the
  read-back);
- the cProfile of one more rollout (host functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

from tik_kernels.e2e import rollout as rollout_mod  # noqa: E402
from tik_kernels.e2e.backends import make_backend  # noqa: E402
from tik_kernels.e2e.model import PRESETS, init_params  # noqa: E402
from tik_kernels.e2e.rollout import PREFILL_TOKENS, RolloutEngine  # noqa: E402
from tik_kernels.e2e.task import make_requests  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Parts:
    def __init__(self):
        self.s: dict[str, float] = {}
        self.n: dict[str, int] = {}

    def add(self, k: str, dt: float) -> None:
        self.s[k] = self.s.get(k, 0.0) + dt
        self.n[k] = self.n.get(k, 0) + 1


def instrument(engine: RolloutEngine, parts: Parts):
    """Wrap the engine's parts in synchronized timers; returns an undo function."""
    orig_launch, orig_fp = engine._launch, rollout_mod.forward_packed
    replay_s = [0.0]  # the replay time of the decode step in progress

    def wrap(g) -> None:
        g._tik_orig = g.replay

        def rep():
            _sync()
            t0 = time.perf_counter()
            g._tik_orig()
            _sync()
            replay_s[0] += time.perf_counter() - t0

        g.replay = rep

    def launch(n, positions, seeds):
        _sync()
        t = time.perf_counter()
        for g in engine._graphs.values():
            if not hasattr(g, "_tik_orig"):
                wrap(g)
        replay_s[0] = 0.0
        out = orig_launch(n, positions, seeds)
        _sync()
        dt = time.perf_counter() - t
        parts.add("decode_replay", replay_s[0])
        parts.add("decode_host", dt - replay_s[0])
        return out

    def forward_packed(*a, **k):
        _sync()
        t = time.perf_counter()
        h = orig_fp(*a, **k)
        _sync()
        parts.add("prefill_forward", time.perf_counter() - t)
        return h

    engine._launch = launch
    rollout_mod.forward_packed = forward_packed

    def undo():
        del engine._launch  # the class's method again
        rollout_mod.forward_packed = orig_fp
        for g in engine._graphs.values():
            if hasattr(g, "_tik_orig"):
                g.replay = g._tik_orig
                del g._tik_orig

    return undo


def profile_backend(name: str, args, mc, params) -> dict:
    be = make_backend(name, stock_compiled=name == "stock")
    max_len = args.prompt_len[1] + args.answer_len[1] + 1
    engine = RolloutEngine(mc, be, max_slots=args.slots, max_len=max_len, prefill_tokens=args.prefill_tokens,
                           device=args.device, share_prompts=not args.no_share_prompts)
    rng = random.Random(0)

    def reqs():
        return make_requests(mc.vocab, args.prompts, args.group, rng, prompt_len=tuple(args.prompt_len),
                             answer_len=tuple(args.answer_len))

    batch = reqs()
    for _ in range(2):  # compiles and graph captures
        engine.generate(params, batch)
    _sync()
    cap0 = engine.stats.capture_s
    steps0, pre0 = engine.stats.decode_steps, engine.stats.prefills
    # plain wall time first, no timers, no profiler: the host ahead of the device, and waiting for every step
    walls: dict[bool, list[float]] = {True: [], False: []}
    bits: dict[bool, list] = {}
    for r in range(args.rounds):
        for overlap in (r % 2 == 0, r % 2 == 1):  # who goes first alternates
            engine.overlap = overlap
            t = time.perf_counter()
            comps = engine.generate(params, batch)
            _sync()
            walls[overlap].append(time.perf_counter() - t)
            bits[overlap] = [(c.tokens, c.old_logprobs().view(torch.int32).tolist()) for c in comps]
    engine.overlap = True
    steps = (engine.stats.decode_steps - steps0) // (2 * args.rounds)
    prefills = (engine.stats.prefills - pre0) // (2 * args.rounds)
    same = bits[True] == bits[False]
    plain, plain_sync = statistics.median(walls[True]), statistics.median(walls[False])
    # device-busy time of one rollout (kernel records)
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=acts) as prof:
        engine.generate(params, batch)
        _sync()
    kern = H.device_kernels(prof)
    sum_us = sum(H.kernel_us(e) for e in kern)
    union = H.busy_us(kern)  # concurrent kernels counted once
    top_dev = prof.key_averages().table(sort_by="self_cuda_time_total" if args.device == "cuda" else
                                        "self_cpu_time_total", row_limit=15)
    # timed parts
    parts = Parts()
    undo = instrument(engine, parts)
    t = time.perf_counter()
    engine.generate(params, batch)
    _sync()
    wall_parts = time.perf_counter() - t
    undo()
    accounted = sum(parts.s.values())
    parts.s["loop_host_and_rest"] = wall_parts - accounted
    # host functions
    pr = cProfile.Profile()
    pr.enable()
    engine.generate(params, batch)
    _sync()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
    tokens = sum(len(c.tokens) for c in comps)
    res = {
        "backend": name, "tokens": tokens, "decode_steps": steps, "prefills": prefills,
        "wall_s": plain, "ms_per_decode_step": plain / max(1, steps) * 1e3,
        "wall_s_no_overlap": plain_sync, "overlap_speedup": plain_sync / plain, "rounds": args.rounds,
        "walls_s": {"overlap": walls[True], "no_overlap": walls[False]}, "overlap_same_bits": same,
        "device_busy_s_union": union / 1e6, "device_busy_s_sum": sum_us / 1e6,
        "timed_wall_s": wall_parts, "parts_s": parts.s, "parts_n": parts.n,
        "capture_s_in_timed": engine.stats.capture_s - cap0,
        "buckets": sorted(set(engine.stats.buckets)),
        "top_device_ops": top_dev, "cprofile": buf.getvalue(),
    }
    print(json.dumps({k: v for k, v in res.items() if k not in ("top_device_ops", "cprofile")}, indent=1), flush=True)
    print(top_dev, flush=True)
    print(buf.getvalue()[:6000], flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwen3-1.7b", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--backends", nargs="+", default=["unified", "stock"], choices=["unified", "stock"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[32, 192])
    ap.add_argument("--answer-len", type=int, nargs=2, default=[16, 96])
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=PREFILL_TOKENS,
                    help="the most prompt tokens one prefill admits (the engine's prefill_tokens; tik e2e's default)")
    ap.add_argument("--no-share-prompts", action="store_true",
                    help="every request's prompt prefilled on its own, not once for its GRPO group")
    ap.add_argument("--rounds", type=int, default=5, help="rollouts timed with and without overlap, interleaved")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default="rollout_profile_h200")
    args = ap.parse_args()
    if args.prefill_tokens < 1:
        ap.error(f"--prefill-tokens must be at least 1, got {args.prefill_tokens}")
    args.device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke run of the script itself
    mc = PRESETS[args.preset]
    if args.layers:
        mc = mc.with_layers(args.layers)
    params = init_params(mc, 0, args.device)
    doc = {"env": H.environment(), "command": H.command_line(), "preset": args.preset,
           "layers": mc.layers, "runs": [profile_backend(b, args, mc, params) for b in args.backends]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
