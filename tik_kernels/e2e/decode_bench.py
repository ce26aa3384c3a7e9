"""One decode step of the rollout engine against the memory-bandwidth floor.

A decode step of B sequences at context L must read every weight the step multiplies with once
(bf16: the layers' projections, the norms and the lm_head; of the embedding only B rows) and the
B sequences' cached keys and values; it writes one new key and value per sequence and layer. At
the GPU's copy bandwidth that is a floor no engine beats; the issue's target is a step within 3x
of it. Timed here: the engine's own `decode` call (a step waited for: the inputs' copy, the graph
replay or the eager launches, the read-back of the sampled tokens); the steps as `generate` runs
them, the host queueing each while the device runs the one before (`overlap_ms`: the ids from the
device, results copied aside, no read-back); and, with graphs, the replays alone back to back (the
device's time).
"""

from __future__ import annotations

import statistics
import time

import torch

from tik_kernels.e2e.model import ModelConfig, init_params
from tik_kernels.e2e.rollout import RolloutEngine, token_seeds


def decode_floor_bytes(cfg: ModelConfig, batch: int, context: int) -> dict:
    """Bytes one decode step must move: weights read, KV read (`context` entries per sequence), KV written."""
    H, D = cfg.hidden, cfg.head_dim
    per_layer = H * D * (2 * cfg.heads + 2 * cfg.kv_heads) + 3 * H * cfg.ffn + 2 * H + 2 * D * cfg.qk_norm
    weights = 2 * (cfg.layers * per_layer + cfg.vocab * H + H + batch * H)  # lm_head, final norm, B embedding rows
    kv_row = cfg.layers * cfg.kv_heads * D * 2 * 2  # k and v, bf16, one position of one sequence
    return {"weights": weights, "kv_read": batch * context * kv_row, "kv_write": batch * kv_row,
            "total": weights + batch * context * kv_row + batch * kv_row}


def time_decode(cfg: ModelConfig, backend, *, batch: int, context: int, graphs: bool, device: str = "cuda",
                reps: int = 20, rounds: int = 5, tbps: float = 4.2, seed: int = 0, params=None) -> dict:
    """Median time of one decode step of `batch` sequences, each at position context - 1, the cache filled with
    random keys and values; against the floor at `tbps` TB/s. `params`: fp32 weights (default: random)."""
    if params is None:
        params = init_params(cfg, seed, device)
    eng = RolloutEngine(cfg, backend, max_slots=batch, max_len=context, device=device, graphs=graphs,
                        buckets=(batch,))
    eng.load_weights(params)
    g = torch.Generator(device=device).manual_seed(seed)
    eng.cache.k.normal_(generator=g)
    eng.cache.v.normal_(generator=g)
    ids = torch.randint(1, cfg.vocab, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
    pos = [context - 1] * batch
    seeds = token_seeds(list(range(batch)), pos)
    cuda = torch.device(device).type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    eng.decode(ids, pos, seeds)  # compiles, captures
    sync()
    if graphs and not eng.graphs:
        raise RuntimeError(f"the decode step could not be captured: {eng.stats.graph_error}")
    step_ms = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            eng.decode(ids, pos, seeds)
        sync()
        step_ms.append((time.perf_counter() - t) / reps * 1e3)
    overlap_ms = []  # what a step costs in `generate`: launched behind the one before, results kept on the device
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            eng._queue_step(batch, pos, seeds)
        sync()
        overlap_ms.append((time.perf_counter() - t) / reps * 1e3)
    eng._lead.clear()
    out = {"batch": batch, "context": context, "graphs": graphs, "backend": backend.name,
           "step_ms": statistics.median(step_ms), "step_ms_spread": max(step_ms) - min(step_ms),
           "overlap_ms": statistics.median(overlap_ms),
           "graphs_captured": eng.stats.graphs_captured, "capture_s": eng.stats.capture_s}
    if graphs:
        (graph,) = eng._graphs.values()
        replay_ms = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record()
            end.synchronize()
            replay_ms.append(start.elapsed_time(end) / reps)
        out["replay_ms"] = statistics.median(replay_ms)
    nbytes = decode_floor_bytes(cfg, batch, context)
    floor_ms = nbytes["total"] / (tbps * 1e12) * 1e3
    out |= {"bytes": nbytes, "floor_ms": floor_ms, "tbps": tbps, "step_over_floor": out["step_ms"] / floor_ms,
            "overlap_over_floor": out["overlap_ms"] / floor_ms}
    if "replay_ms" in out:
        out["replay_over_floor"] = out["replay_ms"] / floor_ms
    return out
