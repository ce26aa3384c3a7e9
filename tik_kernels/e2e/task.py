"""A synthetic task a tiny model can learn by GRPO from scratch: answer by repeating the
prompt's last token. Reward = the fraction of answer tokens equal to it.

The last token rather than the first: "emit the token you were fed" is a rule a randomly initialised
decoder can find from reward alone in a few dozen GRPO steps (each answer position sees the token to
repeat as its own input once the previous answer token is right), where copying the first token needs
an attention pattern a reward of ~1/vocab seldom reinforces."""

from __future__ import annotations

import random

import torch

from tik_kernels.e2e.rollout import Completion, Request


def make_requests(vocab: int, n_prompts: int, group: int, rng: random.Random, *, prompt_len=(3, 9),
                  answer_len=(2, 6), seed_base: int = 0) -> list[Request]:
    """`n_prompts` prompts, each asked `group` times (a GRPO group), lengths drawn at random."""
    reqs = []
    for g in range(n_prompts):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_len))]
        for k in range(group):
            reqs.append(Request(prompt, rng.randint(*answer_len), seed=seed_base + g * group + k, group=g))
    rng.shuffle(reqs)  # groups arrive interleaved, as in a real rollout queue
    return reqs


def rewards(completions: list[Completion], kind: str = "copy") -> torch.Tensor:
    """`copy`: the task above. `parity`: the fraction of answer tokens with an even id, a reward with signal from
    the first step at any vocabulary (a random policy earns ~1/2, so a group's rewards differ and every update
    moves the policy). At a real model's vocabulary a random policy almost never repeats the token (~1/151,936 a
    token), so every reward of a throughput run is 0, every advantage 0 and every update leaves the policy as it
    was: the same compute, but the ratio stays 1. The throughput benchmark takes `parity`, so its updates are real."""
    if kind not in REWARDS:
        raise ValueError(f"unknown reward {kind!r} (one of {', '.join(REWARDS)})")
    r = [sum(REWARDS[kind](t, c) for t in c.tokens) / max(1, len(c.tokens)) for c in completions]
    return torch.tensor(r, dtype=torch.float32)


#: per answer token: did it earn the reward
REWARDS = {"copy": lambda t, c: t == c.request.prompt[-1], "parity": lambda t, c: t % 2 == 0}
