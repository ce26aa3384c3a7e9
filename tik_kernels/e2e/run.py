"""`tik e2e`: one RL step loop in three modes that share every line of code but the kernels.

A — stock PyTorch kernels for rollout and trainer; old log-probs recomputed by an extra forward.
C — the unified kernels; still recomputing.
B — the unified kernels; the rollout's log-probs reused as the old log-probs (no recompute pass).

For every mode it reports how many rollout log-probs equal the trainer's own computation bit
for bit, the max |Δlogp|, and the time split rollout / recompute / train.
"""

from __future__ import annotations

import copy
import gc
import random
import time
from dataclasses import dataclass

import torch

from tik_kernels.e2e.backends import make_backend
from tik_kernels.e2e.model import PRESETS, ModelConfig, config_dict, init_params
from tik_kernels.e2e.rollout import PREFILL_TOKENS, RolloutEngine
from tik_kernels.e2e.task import make_requests, rewards
from tik_kernels.e2e.trainer import group_advantages, grpo_step, make_optimizer, pack, sequence_logprobs

MODES = {"A": ("stock", True), "C": ("unified", True), "B": ("unified", False)}


@dataclass
class E2EConfig:
    preset: str = "tiny"
    layers: int | None = None
    modes: tuple[str, ...] = ("A", "C", "B")
    steps: int = 2
    warmup: int = 0
    prompts: int = 4
    group: int = 4
    prompt_len: tuple[int, int] = (3, 9)
    answer_len: tuple[int, int] = (2, 6)
    max_slots: int = 8
    #: the most prompt tokens one prefill admits (the engine's `prefill_tokens`)
    prefill_tokens: int = PREFILL_TOKENS
    temperature: float = 1.0
    lr: float = 1e-3
    #: passes over each rollout batch (PPO epochs); > 1 moves the ratio off 1 so the clip binds
    ppo_epochs: int = 2
    #: updates per pass: the batch cut into this many minibatches of whole sequences (verl's ppo_mini_batch_size,
    #: OpenRLHF's micro-batches of a rollout), one optimizer update each; > 1 moves the ratio off 1 from the second
    #: minibatch on, with each token trained once per pass
    minibatches: int = 1
    #: weight of the KL(policy || initial policy) term; 0 = none (then no reference forward is run)
    kl_coef: float = 0.0
    #: the reward (`task.rewards`): "copy" (the task a small model learns from scratch), "parity" (signal from step
    #: one at any vocabulary: the throughput benchmark's, so its updates move the policy)
    reward: str = "copy"
    seed: int = 0
    device: str | None = None
    checkpoint: str | None = None
    #: replay decode steps as CUDA graphs (None: on CUDA)
    graphs: bool | None = None
    #: a GRPO group's prompt prefilled once for the group (the engine's `share_prompts`, as vLLM's n samples of a
    #: prompt share its prefill); False: every request prefilled on its own, the engine before session 33
    share_prompts: bool = True
    #: mode A's norms, rope, SwiGLU product and log-softmax / sampling rows through torch.compile, as a tuned stock
    #: engine runs them (None: on CUDA; `StockBackend`)
    stock_compiled: bool | None = None


#: `tik e2e`'s defaults per device. Sequences longer than 16 tokens: on the CPU stock SDPA gives a row bits that
#: depend on the length its batch was padded to (11 keys keep their bits padded to 15, not to 16; 17 keys padded to
#: 20, not to 32), and rollout and trainer pad to different lengths; the old defaults (at most 15 tokens) never
#: reached 16, so stock showed no mismatch at all. Measured (`tik e2e --modes A`, tiny model, seeds 0-3): 6/34,
#: 29/30, 11/35 and 26/33 rollout log-probs differ from the trainer's. The CPU default runs modes A and B for one
#: step: the unified kernels run in Triton's interpreter there (~35 s a mode-step), and mode C's equality is B's.
#: It admits at most 24 prompt tokens per prefill (one prompt of up to 20; its group's other requests join as copies
#: of it, `share_prompts`), so requests join a batch that is already decoding, as in a busy engine. Equal at seeds 0-3
#: (session 33, the group's prompt prefilled once): 19/34, 0/30, 19/35, 10/33 with 24 tokens; with 40, the default
#: before, 34/34, 0/30, 35/35, 10/33 (without shared prompts 40 gave 28/34, 2/30, 29/35, 8/33).
CLI_DEFAULTS = {
    "cpu": {"modes": ("A", "B"), "steps": 1, "prompts": 2, "group": 4, "prompt_len": (8, 20), "answer_len": (2, 6),
            "prefill_tokens": 24},
    "cuda": {"modes": ("A", "C", "B"), "steps": 2, "prompts": 4, "group": 4, "prompt_len": (8, 20),
             "answer_len": (2, 6)},
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


#: the caching allocator's counters a phase can move: blocks got from and given back to the driver (each a
#: cudaMalloc / cudaFree, which waits for the device), an allocation that freed every cached block and tried again
ALLOC_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def alloc_counts(device: str) -> dict:
    """The caching allocator's ALLOC_KEYS counters so far ({} off the GPU)."""
    if not device.startswith("cuda"):
        return {}
    st = torch.cuda.memory_stats(device)
    return {k: st.get(k, 0) for k in ALLOC_KEYS}


def alloc_delta(a: dict, b: dict) -> dict:
    """The counters moved from `alloc_counts` a to b."""
    return {k: b[k] - a[k] for k in a}


def model_for(cfg: E2EConfig, device: str) -> tuple[ModelConfig, dict]:
    if cfg.checkpoint:
        from tik_kernels.e2e.model import load_hf

        mc, params = load_hf(cfg.checkpoint, device)
        if cfg.layers:
            mc = mc.with_layers(cfg.layers)
        return mc, params
    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown model preset {cfg.preset!r} (known: {', '.join(PRESETS)})")
    mc = PRESETS[cfg.preset]
    if cfg.layers:
        mc = mc.with_layers(cfg.layers)
    return mc, init_params(mc, cfg.seed, device)


def run_mode(mode: str, cfg: E2EConfig, mc: ModelConfig, params0: dict, device: str, impl_files=None,
             on_step=None, on_progress=None) -> dict:
    """`on_progress(event)` is called as the mode runs: event = {mode, step (1-based), steps, phase (rollout,
    recompute, train), tokens (generated or processed so far in the phase), seconds (in the phase), done}."""
    backend_name, recompute = MODES[mode]
    torch.manual_seed(cfg.seed)  # stock sampling draws from torch's generator: the same run gives the same tokens
    compiled = device.startswith("cuda") if cfg.stock_compiled is None else cfg.stock_compiled
    be = make_backend(backend_name, impl_files, stock_compiled=compiled)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params0.items()}
    opt = make_optimizer(params, cfg.lr)
    max_len = cfg.prompt_len[1] + cfg.answer_len[1] + 1
    n_steps = cfg.warmup + cfg.steps
    where = {"step": 0, "phase": "", "t0": 0.0}  # where the mode has got to, for `report`

    def report(tokens: int, done: bool = False) -> None:
        if on_progress:
            on_progress({"mode": mode, "step": where["step"], "steps": n_steps, "phase": where["phase"],
                         "tokens": tokens, "seconds": time.perf_counter() - where["t0"], "done": done})

    def phase(name: str) -> None:
        where["phase"], where["t0"] = name, time.perf_counter()
        report(0)

    engine = RolloutEngine(mc, be, max_slots=cfg.max_slots, max_len=max_len, prefill_tokens=cfg.prefill_tokens,
                           temperature=cfg.temperature, device=device, graphs=cfg.graphs, on_token=report,
                           share_prompts=cfg.share_prompts)
    ref_params = {k: v.detach().clone() for k, v in params0.items()} if cfg.kl_coef else None
    rng = random.Random(cfg.seed)
    clip_fracs: list[float] = []
    ratio_devs: list[float] = []
    times = {"rollout": [], "recompute": [], "train": []}
    allocs = {k: [] for k in times}  # each timed step's allocator counters moved in each phase
    train_prep: list[float] = []  # the part of each timed train phase before its first update
    capture_timed = 0.0
    equal = total = 0
    max_diff = 0.0
    recompute_equal = 0
    reward_curve, batch_sizes = [], []
    for step in range(n_steps):
        where["step"] = step + 1
        reqs = make_requests(mc.vocab, cfg.prompts, cfg.group, rng, prompt_len=cfg.prompt_len,
                             answer_len=cfg.answer_len, seed_base=step * 100_000)
        _sync(device)
        phase("rollout")
        a0 = alloc_counts(device)
        t0 = time.perf_counter()
        captured_s = engine.stats.capture_s
        comps = engine.generate(params, reqs)
        _sync(device)
        # a CUDA graph's capture (once per decode bucket, for the engine's life) is set-up, not rollout: a step that
        # met a new bucket would otherwise carry it (stock SDPA's graphs, per KV-length bucket too, meet more)
        capture = engine.stats.capture_s - captured_s
        t1 = time.perf_counter() - capture
        a1 = alloc_counts(device)
        report(sum(len(c.tokens) for c in comps), done=True)
        packed = pack(comps, device)
        n_packed = packed.ids.numel()
        rollout_lp = torch.cat([c.old_logprobs() for c in comps]).to(device)
        if recompute:
            phase("recompute")
            old, _ = sequence_logprobs(mc, be, params, packed, cfg.temperature, grad=False)
        else:
            old = rollout_lp
        _sync(device)
        t2 = time.perf_counter() - capture
        a2 = alloc_counts(device)
        if recompute:
            report(n_packed, done=True)
        phase("train")
        # rewards and advantages on the host, where the completions are: a group's mask and its rows on the GPU were
        # a host sync each (32 groups, 32 waits a step), in the train phase of every mode
        r = rewards(comps, cfg.reward)
        adv = group_advantages(r, torch.tensor([c.request.group for c in comps])).to(device)
        ref = None
        if cfg.kl_coef:
            ref, _ = sequence_logprobs(mc, be, ref_params, packed, cfg.temperature, grad=False)
        parts = minibatches(comps, cfg.minibatches)
        # one minibatch is the whole batch, packed already
        batches = [(packed if len(parts) == 1 else pack(comps[s], device), s, t) for s, t in parts]
        checked, check_s = (trainer_logprobs(mc, be, params, batches, cfg.temperature, device)
                            if len(batches) > 1 else (None, 0.0))
        prep = time.perf_counter() - capture - check_s - t2  # rewards, advantages, packing: the host's, before updates
        first, figures, trained_tokens = None, [], 0
        for epoch in range(cfg.ppo_epochs):
            for k, (mb, seqs, toks) in enumerate(batches):
                res = grpo_step(mc, be, params, opt, mb, old[toks].detach(), adv[seqs], temperature=cfg.temperature,
                                ref_logprobs=None if ref is None else ref[toks], kl_coef=cfg.kl_coef)
                first = first or res
                figures.append((res.clip_frac, res.ratio_max_dev))  # read after the phase: no wait on the GPU here
                trained_tokens += mb.ids.numel()
                report(trained_tokens, done=epoch + 1 == cfg.ppo_epochs and k + 1 == len(batches))
        _sync(device)
        t3 = time.perf_counter() - capture - check_s
        a3 = alloc_counts(device)
        clip_fracs.extend(float(c) for c, _ in figures)
        ratio_devs.extend(float(d) for _, d in figures)
        # the trainer's own log-probs (its training forward before any update, of each minibatch as it is packed for
        # its update) against the rollout's
        trained = first.logprobs if checked is None else checked
        eq = torch.eq(trained.view(torch.int32), rollout_lp.view(torch.int32))
        equal += int(eq.sum())
        total += eq.numel()
        max_diff = max(max_diff, float((trained - rollout_lp).abs().max()))
        if recompute:
            recompute_equal += int(torch.eq(old.view(torch.int32), rollout_lp.view(torch.int32)).sum())
        reward_curve.append(float(r.mean()))
        batch_sizes.extend(engine.stats.batch_sizes)
        engine.stats.batch_sizes = []
        if step >= cfg.warmup:
            times["rollout"].append(t1 - t0)
            times["recompute"].append(t2 - t1)
            times["train"].append(t3 - t2)
            train_prep.append(prep)
            capture_timed += capture
            for k, (a, b) in zip(allocs, ((a0, a1), (a1, a2), (a2, a3)), strict=True):
                allocs[k].append(alloc_delta(a, b))
        if on_step:
            on_step(mode, step, float(r.mean()), res)
    total_t = sum(sum(v) for v in times.values())
    return {
        "mode": mode,
        "backend": backend_name,
        "recompute": recompute,
        "steps": cfg.steps,
        "steps_per_s": cfg.steps / total_t if total_t > 0 else None,
        "time_s": {k: sum(v) for k, v in times.items()},
        #: each timed step's phases, in step order: a drift over the steps (clocks, the allocator) shows here, where
        #: the sums above hide it
        "time_s_steps": {k: [round(x, 6) for x in v] for k, v in times.items()},
        #: beside them, each timed step's phases' allocator counters (ALLOC_KEYS; {} each off the GPU): a phase that
        #: gets memory from the driver, or frees the cache to, waits for the device as often (session 43's H100 ran
        #: qwen3-0.6b's train phases 0.50-0.73 s a step where session 34's took 0.43-0.47 s: clocks or the allocator?).
        #: The train phase's count the rollout-vs-trainer check's forwards too, whose seconds its time leaves out
        "alloc_steps": allocs,
        #: of time_s["train"]: rewards, advantages, the minibatches' packing (and the KL reference forward with
        #: kl_coef), until the first update is launched
        "train_prep_s": sum(train_prep),
        "tokens": total,
        "equal_tokens": equal,
        "equal_frac": equal / total if total else None,
        "recompute_equal_tokens": recompute_equal if recompute else None,
        "max_abs_dlogp": max_diff,
        "ppo_epochs": cfg.ppo_epochs,
        "minibatches": cfg.minibatches,
        "clip_frac_mean": sum(clip_fracs) / len(clip_fracs) if clip_fracs else 0.0,
        "ratio_max_dev": max(ratio_devs, default=0.0),
        "rewards": reward_curve,
        "decode_batch_sizes": sorted(set(batch_sizes)),
        "decode_graphs": engine.graphs,
        "graphs_captured": engine.stats.graphs_captured,
        "graph_capture_s": engine.stats.capture_s,
        "graph_error": engine.stats.graph_error,
        #: prompt tokens the rollout's prefills computed, and requests that took a copy of their group's prompt
        "prefill_tokens": engine.stats.prefill_tokens,
        "shared_prompts": engine.stats.shared_prompts,
        #: captures that happened in timed steps (left out of their times)
        "graph_capture_in_timed_steps_s": capture_timed,
        "kernels": getattr(be, "sources", {}),
        "stock_compiled": getattr(be, "compiled", None),
        "stock_compile_errors": be.compile_errors() if hasattr(be, "compile_errors") else {},
        "stock_attention": getattr(be, "attention_path", None),  # mode A's packed attention: varlen flash or padded
    }


def minibatches(comps: list, n: int) -> list[tuple[slice, slice]]:
    """`comps` cut into `n` minibatches of consecutive whole sequences, as even in sequences as they can be (never
    empty: at most one per sequence): (the minibatch's sequences, its answer tokens in the rollout's order)."""
    if n < 1:
        raise ValueError(f"minibatches must be at least 1, not {n}")
    n = min(n, len(comps)) or 1
    bounds = [len(comps) * k // n for k in range(n + 1)]
    ends = [0]
    for c in comps:
        ends.append(ends[-1] + len(c.tokens))
    return [(slice(a, b), slice(ends[a], ends[b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def trainer_logprobs(mc: ModelConfig, be, params: dict, batches: list, temperature: float,
                     device: str) -> tuple[torch.Tensor, float]:
    """Every minibatch's training forward at the rollout's weights, the way its update will compute it (the same
    packing, with gradients, its graph dropped), for the rollout-vs-trainer check: with several minibatches an update
    comes before the later minibatches' own forwards. Untimed: (log-probs in the rollout's order, seconds taken)."""
    _sync(device)
    t0 = time.perf_counter()
    out = [sequence_logprobs(mc, be, params, mb, temperature, grad=True)[0].detach() for mb, _, _ in batches]
    _sync(device)
    return torch.cat(out), time.perf_counter() - t0


def run_e2e(cfg: E2EConfig, impl_files=None, on_step=None, on_progress=None) -> dict:
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    mc, params0 = model_for(cfg, device)
    out = {"model": config_dict(mc) | {"preset": cfg.preset, "params": mc.n_params()}, "device": device,
           "config": {k: v for k, v in cfg.__dict__.items() if k != "checkpoint"}, "modes": {}}
    cuda = device.startswith("cuda")
    if cuda:
        out["gpu"] = torch.cuda.get_device_name()
    for m in cfg.modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r} (A, B or C)")
        # the mode before this one is gone before this one allocates: its engine (KV cache, graphs), optimizer
        # state and gradients, including any kept only by a reference cycle; each mode's peak is then its own
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        out["modes"][m] = run_mode(m, cfg, mc, copy.copy(params0), device, impl_files, on_step,
                                  on_progress)
        if cuda:
            out["modes"][m]["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    out["speedup"] = speedups(out["modes"])
    return out


def speedups(ms: dict) -> dict:
    """Throughput ratios between the modes that ran. B_over_C, B_over_A: steps/s over steps/s, each mode timed in
    its own run. B_over_C_paired: B and C run the same kernels on the same tokens (the same seed, the same
    rollouts) and differ only in the recompute phase, so their rollout and train phases are the same work timed
    twice; the paired ratio takes each of those phases' mean over the two runs and keeps each mode's recompute:
    (R + recompute_C + T) / (R + recompute_B + T). Run-order effects (clocks, allocator state) that make B's
    identical phases faster or slower than C's cancel out of it; the unpaired ratio keeps them."""
    sp = {}
    if "B" in ms and "C" in ms and ms["B"]["steps_per_s"] and ms["C"]["steps_per_s"]:
        sp["B_over_C"] = ms["B"]["steps_per_s"] / ms["C"]["steps_per_s"]
        tb, tc = ms["B"]["time_s"], ms["C"]["time_s"]
        shared = sum((tb[k] + tc[k]) / 2 for k in ("rollout", "train"))
        sp["B_over_C_paired"] = (shared + tc["recompute"]) / (shared + tb["recompute"])
    if "B" in ms and "A" in ms and ms["B"]["steps_per_s"] and ms["A"]["steps_per_s"]:
        sp["B_over_A"] = ms["B"]["steps_per_s"] / ms["A"]["steps_per_s"]
    return sp
