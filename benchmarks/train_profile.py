"""Where the trainer's time goes: the GRPO updates of one rollout batch, phase by phase.

    PYTHONPATH=. python benchmarks/train_profile.py --preset qwen3-0.6b --out benchmarks/results \
        --name train_profile_h200_qwen3-0.6b

The batch is `bench_e2e.py`'s minibatch setting (`gpu_pending.sh e2e_minibatch`): one rollout of 32 prompts x 8
(prompts of 32-192 tokens, answers of 16-96, 256 slots, the parity reward), packed and cut into 4 minibatches of
whole sequences as `tik e2e` cuts it, one `grpo_step` each. Then, interleaved over `--rounds` rounds (medians):
- `train`: the updates alone (mode B's train phase);
- `recompute`: the old log-probs' forward without gradients (what mode B saves);
- `train_after_recompute`: the updates right after a recompute pass (mode C's order). Modes C and B run the same
  updates, yet C's train phase has come out slower (H100, qwen3-1.7b: 4.68 s against 2.44 s,
  `e2e_h100_minibatch_qwen3-1.7b_s22.json`): is it the pass before it (the caching allocator, whose counters are
  kept beside each time), or the order the modes ran in?
With `--variant NAME=OP.KEY=VALUE[,...]` (repeatable) each round also times the updates under those CONFIG values
(`train[NAME]`, interleaved with the rest: same run, same batch). A variant may move gradient bits where the key is
part of a gradient's reduction tree (add_rmsnorm's and rmsnorm's BWD_ROWS: the weight gradient's row blocks), never
a forward's: the updates stay deterministic, and a variant runs on its own copy of the parameters and optimizer, so
the base's updates never see its steps.
Then one pass of the updates with each part behind synchronized timers (forward + log-probs, loss, backward, gradient
clip, optimizer step, the rest), and one under torch.profiler: the device-busy time (union of kernel intervals),
the kernels by total device time, and the model FLOPs a pass needs (projections, attention, lm_head: forward, and
twice that backward), so the rate it reaches sits beside the GPU's (~700 TFLOP/s bf16 dense); and one under
cProfile: the host's functions by own time.
On a CPU the script runs the same code at `--preset tiny` (a smoke run of the script).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

from tik_kernels.e2e import trainer as trainer_mod  # noqa: E402
from tik_kernels.e2e.backends import config_overrides, make_backend  # noqa: E402
from tik_kernels.e2e.model import PRESETS, init_params  # noqa: E402
from tik_kernels.e2e.rollout import RolloutEngine  # noqa: E402
from tik_kernels.e2e.run import alloc_counts, alloc_delta, minibatches  # noqa: E402
from tik_kernels.e2e.task import make_requests, rewards  # noqa: E402
from tik_kernels.e2e.trainer import group_advantages, grpo_step, make_optimizer, pack, sequence_logprobs  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _alloc_counts() -> dict:
    return alloc_counts("cuda" if torch.cuda.is_available() else "cpu")


def model_flops(mc, batches) -> dict:
    """Forward FLOPs of the updates' passes (a multiply-add = 2): every packed token through the projections,
    causal attention within each sequence, the answer rows through the lm_head (log-probs, and the logged entropy's
    second pass). Backward is twice the forward of what has gradients (the entropy has none)."""
    H_, D = mc.hidden, mc.head_dim
    proj = H_ * D * (2 * mc.heads + 2 * mc.kv_heads) + 3 * H_ * mc.ffn
    fwd = lm = 0.0
    for mb, _, _ in batches:
        T = mb.ids.numel()
        A = mb.rows.numel()
        attn = sum(L * (L + 1) / 2 for L in mb.lens) * 2 * 2 * mc.heads * D  # QK^T and PV, causal
        fwd += mc.layers * (2 * T * proj + attn) + 2 * A * mc.vocab * H_
        lm += 2 * A * mc.vocab * H_  # the entropy's pass, no backward
    return {"forward": fwd, "train": 3 * fwd + lm}


class Timers:
    """Synchronized timers around grpo_step's parts (the device drained before and after each)."""

    def __init__(self):
        self.s: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            _sync()
            t = time.perf_counter()
            out = fn(*a, **k)
            _sync()
            self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t
            return out

        return timed


def parts_of_one_pass(run_pass, opt) -> dict:
    """One pass of the updates with forward, backward, clip and optimizer step timed apart; the rest (loss, ratio
    figures, zero_grad) is the pass's wall time minus those."""
    tm = Timers()
    saved = (trainer_mod.sequence_logprobs, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_, opt.step)
    trainer_mod.sequence_logprobs = tm.wrap("forward_logprobs", saved[0])
    torch.Tensor.backward = tm.wrap("backward", saved[1])
    torch.nn.utils.clip_grad_norm_ = tm.wrap("clip_grad_norm", saved[2])
    opt.step = tm.wrap("optimizer_step", saved[3])
    try:
        _sync()
        t = time.perf_counter()
        run_pass()
        _sync()
        wall = time.perf_counter() - t
    finally:
        trainer_mod.sequence_logprobs, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_ = saved[:3]
        del opt.step  # the class's method again
    tm.s["rest"] = wall - sum(tm.s.values())
    return {"wall_s": wall, "parts_s": tm.s}


def device_profile(run_pass, cuda: bool, rows: int = 30) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync()
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        run_pass()
        _sync()
    wall = time.perf_counter() - t
    kern = H.device_kernels(prof)
    by_name: dict[str, list[float]] = {}
    for e in kern:
        by_name.setdefault(e.name, []).append(H.kernel_us(e))
    union = H.busy_us(kern)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:rows]
    return {
        "profiled_wall_s": wall,
        "device_busy_s_union": union / 1e6,
        "kernels": len(kern),
        "top_kernels": [
            {"name": n[:120], "calls": len(v), "total_us": sum(v), "mean_us": sum(v) / len(v)} for n, v in top
        ],
    }


def host_profile(run_pass, rows: int = 40) -> str:
    """cProfile of one pass: the host's functions by own time (a host-bound pass shows where its launches go)."""
    pr = cProfile.Profile()
    _sync()
    pr.enable()
    run_pass()
    _sync()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwen3-0.6b", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--backend", default="unified", choices=["unified", "stock"])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[32, 192])
    ap.add_argument("--answer-len", type=int, nargs=2, default=[16, 96])
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--foreach-adamw", action="store_true",
                    help="AdamW's foreach form instead of the trainer's (fused on CUDA), to time what fusing saves")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OP.KEY=VALUE[,...]",
                    type=lambda spec: H.parse_config_spec(spec, H.OPERATORS, "--variant"),
                    help="also time the updates with these CONFIG values, interleaved (train[NAME]); repeatable")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default="train_profile_h200_qwen3-0.6b")
    args = ap.parse_args(argv)
    if (err := H.unknown_config_keys(args.variant, "--variant")) is not None:
        ap.error(err)
    if args.variant and args.backend != "unified":
        ap.error("--variant sets the unified kernels' CONFIG: it needs --backend unified")
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    mc = PRESETS[args.preset]
    if args.layers:
        mc = mc.with_layers(args.layers)
    params0 = init_params(mc, 0, device)
    be = make_backend(args.backend, stock_compiled=cuda and args.backend == "stock")
    max_len = args.prompt_len[1] + args.answer_len[1] + 1
    engine = RolloutEngine(mc, be, max_slots=args.slots, max_len=max_len, device=device)
    reqs = make_requests(
        mc.vocab,
        args.prompts,
        args.group,
        random.Random(0),
        prompt_len=tuple(args.prompt_len),
        answer_len=tuple(args.answer_len),
    )
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params0.items()}
    comps = engine.generate(params, reqs)
    packed = pack(comps, device)
    old = torch.cat([c.old_logprobs() for c in comps]).to(device)
    adv = group_advantages(
        rewards(comps, "parity").to(device), torch.tensor([c.request.group for c in comps], device=device)
    )
    parts = minibatches(comps, args.minibatches)
    batches = [(pack(comps[s], device), s, t) for s, t in parts]

    def optimizer(ps):
        return (torch.optim.AdamW(list(ps.values()), lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0, foreach=True)
                if args.foreach_adamw else make_optimizer(ps, 1e-6))

    opt = optimizer(params)

    def train(ps=params, o=opt):
        for mb, s, t in batches:
            grpo_step(mc, be, ps, o, mb, old[t], adv[s])

    # each variant on its own parameters and optimizer (copies of the base's before any update), so that the base's
    # timed updates see only their own steps
    variants = []
    for name, over in args.variant:
        ps = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        o = optimizer(ps)

        def run(ps=ps, o=o, over=over):
            with config_overrides(over, be):
                train(ps, o)

        variants.append((f"train[{name}]", run))

    def recompute():  # as run_mode's recompute phase: grad=False runs it without the autograd graph
        sequence_logprobs(mc, be, params, packed, 1.0, grad=False)

    for _ in range(2):  # compiles, the allocator's pools, AdamW's state
        recompute()
        train()
        for _, run in variants:
            run()
    _sync()
    samples: dict[str, list[float]] = {"train": [], "recompute": [], "train_after_recompute": [],
                                       **{name: [] for name, _ in variants}}
    allocs: dict[str, list[dict]] = {k: [] for k in samples}

    def timed(name, fn):
        a0 = _alloc_counts()
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        samples[name].append(time.perf_counter() - t)
        a1 = _alloc_counts()
        allocs[name].append(alloc_delta(a0, a1))

    for r in range(args.rounds):
        order = [("train", train), ("recompute", recompute), *variants]
        if r % 2:
            order.reverse()
        for name, fn in order:
            timed(name, fn)
        recompute()
        timed("train_after_recompute", train)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    train()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    one = parts_of_one_pass(train, opt)
    prof = device_profile(train, cuda)
    host = host_profile(train)
    flops = model_flops(mc, batches)
    tokens = sum(mb.ids.numel() for mb, _, _ in batches)
    med = {k: statistics.median(v) for k, v in samples.items()}
    doc = {
        "env": H.environment(),
        "command": H.command_line(),
        "preset": args.preset,
        "layers": mc.layers,
        "backend": args.backend,
        "sequences": len(comps),
        "packed_tokens": tokens,
        "answer_tokens": int(old.numel()),
        "minibatches": len(batches),
        "rounds": args.rounds,
        "median_s": med,
        "samples_s": samples,
        "allocator_deltas": allocs,
        "peak_allocated_gb": None if peak is None else peak / 2**30,
        "one_pass": one,
        "profile": prof,
        "host_cprofile": host,
        "model_flops": flops,
        "train_tflops_per_s": flops["train"] / med["train"] / 1e12,
        "train_tflops_per_s_busy": flops["train"] / max(prof["device_busy_s_union"], 1e-9) / 1e12,
        "recompute_over_train": med["recompute"] / med["train"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    H.write_json(args.out / f"{args.name}.json", doc)
    lines = [
        f"# The trainer's updates, part by part ({doc['env'].get('gpu') or 'cpu'})",
        "",
        f"`{doc['command']}`  ",
        f"{args.preset}, {mc.layers} layers, {args.backend}: {len(comps)} sequences, "
        f"{tokens} packed tokens ({doc['answer_tokens']} answer tokens), {len(batches)} minibatch updates a "
        f"pass; medians of {args.rounds} interleaved rounds.",
        "",
        "| phase | median s |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in med.items()]
    lines += [
        "",
        f"recompute / train: {doc['recompute_over_train']:.3f}; model FLOPs of a pass "
        f"{flops['train'] / 1e12:.1f} T: {doc['train_tflops_per_s']:.0f} TFLOP/s of wall time, "
        f"{doc['train_tflops_per_s_busy']:.0f} of device-busy time ({prof['device_busy_s_union']:.3f} s busy "
        f"of {prof['profiled_wall_s']:.3f} s profiled)",
        "",
        "Allocator counters over each timed pass (first round): "
        + "; ".join(f"{k} {allocs[k][0] if allocs[k] else {}}" for k in allocs),
        "",
        "One pass, synchronized part timers (wall " + f"{one['wall_s']:.3f} s):",
        "",
        "| part | s |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in one["parts_s"].items()]
    lines += ["", "| kernel | calls | total ms | mean µs |", "|---|---|---|---|"]
    lines += [
        f"| `{k['name'][:90]}` | {k['calls']} | {k['total_us'] / 1e3:.2f} | {k['mean_us']:.1f} |"
        for k in prof["top_kernels"]
    ]
    lines += ["", "One pass under cProfile (the host's functions by own time):", "", "```", host.strip()[:12000], "```"]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
