"""A rollout engine with continuous batching: requests join and leave between decode steps.

Active requests occupy KV-cache slots 0..n-1 (compacted when one leaves), so every decode
step is a batch of n tokens whose composition changes from step to step. Each sampled
token's log-probability is recorded as the rollout saw it — the number a trainer would
otherwise recompute.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from tik_kernels.e2e.model import KVCache, ModelConfig, bf16_weights, forward_decode, forward_packed, to_device


@dataclass
class Request:
    prompt: list[int]
    max_new: int
    seed: int
    group: int = 0


@dataclass
class Completion:
    request: Request
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: the fp32 log-probs as tensors, bit-exact (floats above are for display)
    logprob_bits: list[torch.Tensor] = field(default_factory=list)

    def old_logprobs(self) -> torch.Tensor:
        return torch.cat(self.logprob_bits)


def token_seeds(seeds: list[int], positions: list[int], device) -> torch.Tensor:
    """Per-token sampling seed from the request's seed and the token's position (same in every regime)."""
    return torch.tensor([(s * 1_000_003 + p) % (2**31 - 1) for s, p in zip(seeds, positions, strict=True)],
                        dtype=torch.int64, device=device)


@dataclass
class RolloutStats:
    decode_steps: int = 0
    prefills: int = 0
    batch_sizes: list[int] = field(default_factory=list)


class RolloutEngine:
    def __init__(self, cfg: ModelConfig, backend, *, max_slots: int = 16, max_len: int = 256,
                 admit_per_step: int | None = None, temperature: float = 1.0, device: str = "cpu"):
        self.cfg, self.be, self.device = cfg, backend, device
        self.max_slots, self.max_len, self.temperature = max_slots, max_len, temperature
        self.admit_per_step = admit_per_step or max(1, max_slots // 4)
        self.cache = KVCache(cfg, max_slots, max_len, device)
        self.stats = RolloutStats()

    @torch.no_grad()
    def generate(self, params: dict[str, torch.Tensor], requests: list[Request]) -> list[Completion]:
        W = bf16_weights(params, grad=False)
        be, cfg = self.be, self.cfg
        for r in requests:
            if len(r.prompt) + r.max_new > self.max_len:
                raise ValueError(f"request of {len(r.prompt)}+{r.max_new} tokens exceeds max_len {self.max_len}")
        waiting = deque(Completion(r) for r in requests)
        active: list[Completion] = []  # active[j] lives in cache slot j
        done: list[Completion] = []

        def emit(comps: list[Completion], hidden: torch.Tensor, positions: list[int]) -> None:
            seeds = token_seeds([c.request.seed for c in comps], positions, self.device)
            ids = be.sample(hidden, W["lm_head"], self.temperature, seeds)
            lp = be.logprob(hidden, W["lm_head"], ids, self.temperature)
            # one read-back per step: the engine needs the tokens on the host to retire requests
            ids_h, lp_h = ids.tolist(), lp.tolist()
            for j, c in enumerate(comps):
                c.tokens.append(ids_h[j])
                c.logprob_bits.append(lp[j : j + 1].clone())
                c.logprobs.append(lp_h[j])

        def retire() -> None:
            j = 0
            while j < len(active):
                c = active[j]
                if len(c.tokens) >= c.request.max_new:
                    done.append(c)
                    last = len(active) - 1
                    if j != last:
                        self.cache.move(last, j)
                        active[j] = active[last]
                    active.pop()
                else:
                    j += 1

        while waiting or active:
            joining = []
            while waiting and len(active) + len(joining) < self.max_slots and len(joining) < self.admit_per_step:
                joining.append(waiting.popleft())
            if joining:
                slots = list(range(len(active), len(active) + len(joining)))
                lens = [len(c.request.prompt) for c in joining]
                ids = to_device([t for c in joining for t in c.request.prompt], self.device)
                cu = to_device([0, *torch.tensor(lens).cumsum(0).tolist()], self.device, torch.int32)
                hidden = forward_packed(cfg, be, W, ids, cu, self.cache, slots, lens)
                last_rows = (cu[1:] - 1).long()
                emit(joining, hidden.index_select(0, last_rows), [n - 1 for n in lens])
                active.extend(joining)
                self.stats.prefills += 1
                retire()
            if not active:
                continue
            ids = to_device([c.tokens[-1] for c in active], self.device)
            positions = [len(c.request.prompt) + len(c.tokens) - 1 for c in active]
            hidden = forward_decode(cfg, be, W, ids, to_device(positions, self.device), self.cache,
                                    kv_len=max(positions) + 1)
            emit(active, hidden, positions)
            self.stats.decode_steps += 1
            self.stats.batch_sizes.append(len(active))
            retire()
        order = {id(r): i for i, r in enumerate(requests)}
        return sorted(done, key=lambda c: order[id(c.request)])
