"""GRPO with several updates per rollout pass (`E2EConfig.minibatches`): the batch is cut into minibatches of whole
sequences, one optimizer update each, so the ratio leaves 1 from the second minibatch on with every token trained once
per pass; the rollout-vs-trainer check still covers every token, each against its own minibatch's training forward at
the rollout's weights."""

from __future__ import annotations

import pytest

from tik_kernels.e2e.rollout import Completion, Request
from tik_kernels.e2e.run import CLI_DEFAULTS, E2EConfig, minibatches, run_e2e


def _comps(lengths: list[int]) -> list[Completion]:
    return [Completion(Request(prompt=[1, 2], max_new=n, group=0, seed=k), tokens=list(range(n)))
            for k, n in enumerate(lengths)]


def test_minibatches_are_whole_consecutive_sequences():
    comps = _comps([3, 1, 4, 1, 5])
    parts = minibatches(comps, 2)
    assert [(s.start, s.stop) for s, _ in parts] == [(0, 2), (2, 5)]
    assert [(t.start, t.stop) for _, t in parts] == [(0, 4), (4, 14)]
    # as many as sequences at most, never an empty one; one is the whole batch
    assert [(s.start, s.stop) for s, _ in minibatches(comps, 9)] == [(k, k + 1) for k in range(5)]
    assert [(t.start, t.stop) for _, t in minibatches(comps, 1)] == [(0, 14)]
    with pytest.raises(ValueError, match="at least 1"):
        minibatches(comps, 0)


def _config(**kw) -> E2EConfig:
    d = {k: v for k, v in CLI_DEFAULTS["cpu"].items() if k != "modes"}
    return E2EConfig(preset="tiny", device="cpu", **(d | {"prompts": 1, "group": 3} | kw))


def test_mode_b_minibatch_updates_move_the_ratio_and_every_token_still_matches():
    # seed 3: a group whose rewards differ (the tiny random model mostly earns 0 everywhere, and equal rewards give
    # zero advantages, so no update would move anything)
    one = run_e2e(_config(modes=("B",), ppo_epochs=1, minibatches=1, seed=3))["modes"]["B"]
    two = run_e2e(_config(modes=("B",), ppo_epochs=1, minibatches=2, seed=3))["modes"]["B"]
    assert two["rewards"][0] > 0 and one["tokens"] == two["tokens"] > 0
    # one update on the rollout's own weights: the ratio is exactly 1
    assert one["ratio_max_dev"] == 0.0
    # the second minibatch's update comes after the first's: its ratio has moved
    assert two["ratio_max_dev"] > 0.0 and two["minibatches"] == 2
    # every token checked, each against its minibatch's forward before any update: the unified kernels agree
    assert two["equal_tokens"] == two["tokens"], two


def test_mode_a_checks_every_token_of_every_minibatch():
    """Stock kernels: the check still covers the whole batch (each minibatch's forward before any update); seed 3
    at these sizes is one where some stock rollout log-probs differ from the trainer's."""
    a = run_e2e(_config(modes=("A",), ppo_epochs=1, minibatches=3, seed=3))["modes"]["A"]
    assert a["tokens"] == 15 and a["minibatches"] == 3
    assert a["equal_tokens"] < a["tokens"]


def test_the_parity_reward_gives_every_group_a_signal_so_the_updates_move_the_policy():
    """The throughput benchmark's reward (`reward="parity"`): a random policy earns ~1/2 of it, so the rewards of a
    group differ, the advantages are not all 0 and the second minibatch's ratio has moved, at a seed where the copy
    task's rewards are all 0 and nothing moves."""
    from tik_kernels.e2e.task import rewards

    copy = run_e2e(_config(modes=("B",), ppo_epochs=1, minibatches=2, seed=0))["modes"]["B"]
    assert max(copy["rewards"]) == 0.0 and copy["ratio_max_dev"] == 0.0
    parity = run_e2e(_config(modes=("B",), ppo_epochs=1, minibatches=2, seed=0, reward="parity"))["modes"]["B"]
    assert 0.0 < parity["rewards"][0] < 1.0 and parity["ratio_max_dev"] > 0.0
    assert parity["equal_tokens"] == parity["tokens"]
    c = _comps([2])[0]
    assert rewards([c], "parity").tolist() == [0.5] and rewards([c]).tolist() == [0.0]
    with pytest.raises(ValueError, match="unknown reward"):
        rewards([c], "likes")
