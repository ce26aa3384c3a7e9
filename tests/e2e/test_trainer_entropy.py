"""GRPO update with entropy_coef = 0: the entropy is logged without gradients, and the update is bit for bit the
one the zero-weighted entropy term gave (that term only added exact zeros, at the cost of a backward through a
second lm_head); with a coefficient the entropy's gradient is there."""

from __future__ import annotations

import torch

from tik_kernels.e2e.backends import StockBackend
from tik_kernels.e2e.model import PRESETS, init_params
from tik_kernels.e2e.rollout import Completion, Request
from tik_kernels.e2e.trainer import grpo_step, pack, sequence_logprobs


def _batch(mc):
    g = torch.Generator().manual_seed(0)
    comps = []
    for i in range(4):
        prompt = torch.randint(0, mc.vocab, (5 + i,), generator=g).tolist()
        toks = torch.randint(0, mc.vocab, (3 + i % 2,), generator=g).tolist()
        comps.append(Completion(Request(prompt=prompt, max_new=len(toks), seed=i, group=i // 2), toks))
    return comps


def _grads_of(mc, params, packed, old, adv, entropy_coef, zero_term: bool):
    """The trainer's loss backward (no optimizer step): the current update, or the earlier `- 0.0 * entropy`."""
    be = StockBackend()
    p = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    lp, ent = sequence_logprobs(mc, be, p, packed, 1.0, grad=True, with_entropy=True,
                                entropy_grad=zero_term or bool(entropy_coef))
    ratio = torch.exp(lp - old)
    a = adv[packed.seq_of_row]
    loss = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
    if zero_term or entropy_coef:
        loss = loss - entropy_coef * ent.mean()
    loss.backward()
    return {k: v.grad for k, v in p.items()}, ent


def test_logged_entropy_changes_no_gradient_bit():
    mc = PRESETS["tiny"]
    params = init_params(mc, 0)
    packed = pack(_batch(mc), "cpu")
    old = torch.zeros(packed.targets.numel())
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    now, ent = _grads_of(mc, params, packed, old, adv, 0.0, zero_term=False)
    before, _ = _grads_of(mc, params, packed, old, adv, 0.0, zero_term=True)
    assert not ent.requires_grad
    for k in now:
        assert torch.equal(now[k], before[k]), k
    with_coef, ent = _grads_of(mc, params, packed, old, adv, 0.1, zero_term=False)
    assert ent.requires_grad and not torch.equal(with_coef["lm_head"], now["lm_head"])


def test_grpo_step_runs_with_and_without_the_entropy_term():
    mc = PRESETS["tiny"]
    packed = pack(_batch(mc), "cpu")
    for coef in (0.0, 0.01):
        params = {k: v.requires_grad_() for k, v in init_params(mc, 0).items()}
        opt = torch.optim.AdamW(list(params.values()), lr=1e-3)
        res = grpo_step(mc, StockBackend(), params, opt, packed, torch.zeros(packed.targets.numel()),
                        torch.tensor([1.0, -1.0, 0.5, -0.5]), entropy_coef=coef)
        assert float(res.entropy) > 0 and torch.isfinite(res.loss)
        # the gradients are freed once the step used them (the rollout and the next forward run without them)
        assert all(p.grad is None for p in params.values())
