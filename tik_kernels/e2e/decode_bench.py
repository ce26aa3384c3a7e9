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


class DecodeTimer:
    """One contender of a decode-step timing: its engine built, the step compiled and captured, then timed a round
    at a time (`round`), so that a benchmark can interleave contenders round by round (the house's method: a machine
    that drifts moves every contender alike) and take medians (`result`)."""

    def __init__(self, cfg: ModelConfig, backend, *, batch: int, context: int, graphs: bool, device: str = "cuda",
                 tbps: float = 4.2, seed: int = 0, params=None):
        if params is None:
            params = init_params(cfg, seed, device)
        self.cfg, self.batch, self.context, self.graphs, self.tbps = cfg, batch, context, graphs, tbps
        self.backend_name = backend.name
        self.eng = eng = RolloutEngine(cfg, backend, max_slots=batch, max_len=context, device=device, graphs=graphs,
                                       buckets=(batch,))
        eng.load_weights(params)
        g = torch.Generator(device=device).manual_seed(seed)
        eng.cache.k.normal_(generator=g)
        eng.cache.v.normal_(generator=g)
        self.ids = torch.randint(1, cfg.vocab, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
        self.pos = [context - 1] * batch
        self.seeds = token_seeds(list(range(batch)), self.pos)
        self.cuda = torch.device(device).type == "cuda"
        eng.decode(self.ids, self.pos, self.seeds)  # compiles, captures
        self._sync()
        if graphs and not eng.graphs:
            raise RuntimeError(f"the decode step could not be captured: {eng.stats.graph_error}")
        self.step_ms: list[float] = []
        self.overlap_ms: list[float] = []
        self.replay_ms: list[float] = []
        self.host_ms: list[float] = []  # of a waited-for step, the host's part before the launch returns
        self.replay_host_ms: list[float] = []  # of a bare replay, the host's call (the graph launch alone)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def round(self, reps: int) -> None:
        """One round: `reps` waited-for steps, `reps` steps queued as `generate` runs them, and with graphs `reps`
        replays back to back, each the mean of its reps."""
        eng = self.eng
        t = time.perf_counter()
        host = 0.0
        for _ in range(reps):
            h = time.perf_counter()
            n = eng._start_decode(self.ids, self.pos, self.seeds)  # `decode`, its host part timed on its own
            host += time.perf_counter() - h
            eng._finish_decode(n)
        self._sync()
        self.step_ms.append((time.perf_counter() - t) / reps * 1e3)
        self.host_ms.append(host / reps * 1e3)
        # what a step costs in `generate`: launched behind the one before, results kept on the device
        t = time.perf_counter()
        for _ in range(reps):
            eng._queue_step(self.batch, self.pos, self.seeds)
        self._sync()
        self.overlap_ms.append((time.perf_counter() - t) / reps * 1e3)
        eng._lead.clear()
        if self.graphs:
            (graph,) = eng._graphs.values()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            h = time.perf_counter()
            for _ in range(reps):
                graph.replay()
            self.replay_host_ms.append((time.perf_counter() - h) / reps * 1e3)
            end.record()
            end.synchronize()
            self.replay_ms.append(start.elapsed_time(end) / reps)

    def result(self) -> dict:
        """Medians over the rounds, against the floor at `tbps` TB/s."""
        eng = self.eng
        out = {"batch": self.batch, "context": self.context, "graphs": self.graphs, "backend": self.backend_name,
               "step_ms": statistics.median(self.step_ms), "step_ms_spread": max(self.step_ms) - min(self.step_ms),
               "overlap_ms": statistics.median(self.overlap_ms), "rounds": len(self.step_ms),
               "host_launch_ms": statistics.median(self.host_ms),
               "graphs_captured": eng.stats.graphs_captured, "capture_s": eng.stats.capture_s}
        if self.replay_ms:
            # the host's part of a waited-for step (host_launch_ms) against the graph launch inside it: the rest is
            # the inputs' staging (the ids, positions and seeds copied in)
            out["replay_ms"] = statistics.median(self.replay_ms)
            out["replay_host_ms"] = statistics.median(self.replay_host_ms)
        nbytes = decode_floor_bytes(self.cfg, self.batch, self.context)
        floor_ms = nbytes["total"] / (self.tbps * 1e12) * 1e3
        out |= {"bytes": nbytes, "floor_ms": floor_ms, "tbps": self.tbps, "step_over_floor": out["step_ms"] / floor_ms,
                "overlap_over_floor": out["overlap_ms"] / floor_ms}
        if "replay_ms" in out:
            out["replay_over_floor"] = out["replay_ms"] / floor_ms
        return out


def time_decode(cfg: ModelConfig, backend, *, batch: int, context: int, graphs: bool, device: str = "cuda",
                reps: int = 20, rounds: int = 5, tbps: float = 4.2, seed: int = 0, params=None) -> dict:
    """Median time of one decode step of `batch` sequences, each at position context - 1, the cache filled with
    random keys and values; against the floor at `tbps` TB/s. `params`: fp32 weights (default: random). One
    contender alone; `DecodeTimer` to interleave several."""
    timer = DecodeTimer(cfg, backend, batch=batch, context=context, graphs=graphs, device=device, tbps=tbps,
                        seed=seed, params=params)
    for _ in range(rounds):
        timer.round(reps)
    return timer.result()
