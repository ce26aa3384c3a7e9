"""The trainer side: a packed varlen forward over prompt + answer, log-probs (and entropy) of
the answer tokens, a GRPO loss with importance ratios and clipping, backward, AdamW step."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from tik_kernels.e2e.model import ModelConfig, bf16_weights, forward_packed, to_device
from tik_kernels.e2e.rollout import Completion


@dataclass
class Packed:
    ids: torch.Tensor  # [T] prompt + answer[:-1] of every sequence, back to back
    cu_seqlens: torch.Tensor  # [n+1] int32
    rows: torch.Tensor  # [A] rows whose hidden state predicts an answer token
    targets: torch.Tensor  # [A] the answer tokens
    seq_of_row: torch.Tensor  # [A] which sequence each answer token belongs to
    lens: list[int]  # sequence lengths on the host, so the forward never reads them back from the GPU


def pack(completions: list[Completion], device) -> Packed:
    """The completions as one packed batch: each sequence's prompt and answer but its last token, back to back.

    Built with array and numpy operations, not a Python loop over tokens: it runs on the host between the rollout
    and the updates of every mode, with the GPU idle (256 sequences of 42k tokens: 9 ms as a loop on this project's
    CPU machine, 1.3 ms now)."""
    n = len(completions)
    P = np.fromiter((len(c.request.prompt) for c in completions), dtype=np.int64, count=n)
    A = np.fromiter((len(c.tokens) for c in completions), dtype=np.int64, count=n)
    L = P + np.maximum(A - 1, 0)  # an answer's last token is predicted, not read
    cu = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(L, out=cu[1:])
    ids = np.fromiter(itertools.chain.from_iterable(
        itertools.chain(c.request.prompt, itertools.islice(c.tokens, max(len(c.tokens) - 1, 0)))
        for c in completions), dtype=np.int64, count=int(cu[-1]))
    targets = np.fromiter(itertools.chain.from_iterable(c.tokens for c in completions), dtype=np.int64,
                          count=int(A.sum()))
    seq = np.repeat(np.arange(n, dtype=np.int64), A)
    # the row predicting answer token a of sequence j: its start + P_j - 1 + a
    rows = np.repeat(cu[:-1] + P - 1 - (np.cumsum(A) - A), A) + np.arange(int(A.sum()), dtype=np.int64)
    t = lambda v, dt=torch.int64: to_device(torch.from_numpy(v), device, dt)  # noqa: E731
    return Packed(t(ids), t(cu, torch.int32), t(rows), t(targets), t(seq), L.tolist())


def sequence_logprobs(cfg: ModelConfig, be, params, packed: Packed, temperature: float, *, grad: bool,
                      with_entropy: bool = False,
                      entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every answer token as the trainer computes them (one packed forward). `entropy_grad` False:
    the entropy is a logged figure, computed outside the autograd graph (no backward through a second lm_head)."""
    with torch.set_grad_enabled(grad):
        W = bf16_weights(params, grad=grad)
        hidden = forward_packed(cfg, be, W, packed.ids, packed.cu_seqlens, lens=packed.lens)
        h = hidden.index_select(0, packed.rows)
        if with_entropy and not (grad and entropy_grad) and hasattr(be, "logprob_entropy"):
            # the logged entropy: the backend's one pass over the lm_head for both where it has one
            return be.logprob_entropy(h, W["lm_head"], packed.targets, temperature)
        lp = be.logprob(h, W["lm_head"], packed.targets, temperature)
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(grad and entropy_grad):
                ent = be.entropy(h, W["lm_head"], temperature)
    return lp, ent


def make_optimizer(params: dict[str, torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """The trainer's AdamW, the same in every mode. On CUDA its fused form: one pass over parameters, gradients and
    both moments instead of a dozen foreach launches over each (H100, qwen3-0.6b, 4 minibatch updates: 89 ms of
    optimizer steps with foreach, 38 ms fused; benchmarks/results/train_profile_h100_qwen3-0.6b_s23{,_fused}.md)."""
    ps = list(params.values())
    fused = bool(ps) and all(p.is_cuda for p in ps)
    return torch.optim.AdamW(ps, lr=lr, betas=(0.9, 0.99), weight_decay=0.0, fused=fused or None)


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """GRPO: each reward normalized by its group's mean and std. A loop over the groups with masks: on the host
    (the caller's rewards are host tensors there), where a mask costs no device wait."""
    adv = torch.zeros_like(rewards)
    for g in groups.unique():
        m = groups == g
        r = rewards[m]
        adv[m] = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
    return adv


@dataclass
class StepResult:
    """One update's figures. The scalars stay 0-d tensors on the device until read (`float(res.loss)`), so an
    update never waits for the GPU: the next one's launches queue behind it."""

    loss: torch.Tensor
    logprobs: torch.Tensor  # the trainer's log-probs of the answer tokens (detached, fp32)
    entropy: torch.Tensor
    ratio_max_dev: torch.Tensor
    clip_frac: torch.Tensor


def grpo_step(cfg: ModelConfig, be, params, opt: torch.optim.Optimizer, packed: Packed, old_logprobs: torch.Tensor,
              advantages: torch.Tensor, *, temperature: float = 1.0, clip: float = 0.2, entropy_coef: float = 0.0,
              max_grad_norm: float = 1.0, ref_logprobs: torch.Tensor | None = None,
              kl_coef: float = 0.0) -> StepResult:
    """One optimizer update, on one minibatch. Called `ppo_epochs` x `minibatches` times on one rollout
    (`E2EConfig`): from the second update on the policy has moved, so the importance ratio leaves 1 and the clip
    binds. With `kl_coef` > 0 the loss adds the
    k3 estimator of KL(policy || reference) (non-negative, unbiased) against `ref_logprobs`. The entropy is in the
    loss only with `entropy_coef`; otherwise it is logged, computed without gradients: a zero-weighted term would
    still cost a backward through the lm_head (and add exact zeros to every gradient)."""
    lp, ent = sequence_logprobs(cfg, be, params, packed, temperature, grad=True, with_entropy=True,
                                entropy_grad=bool(entropy_coef))
    adv = advantages[packed.seq_of_row]
    ratio = torch.exp(lp - old_logprobs)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    loss = -surrogate.mean()
    if entropy_coef:
        loss = loss - entropy_coef * ent.mean()
    if kl_coef and ref_logprobs is not None:
        d = ref_logprobs - lp
        loss = loss + kl_coef * (torch.exp(d) - d - 1).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(params.values()), max_grad_norm)
    opt.step()
    # the gradients freed once the step has used them, not at the next update's backward: the rollout and the next
    # update's forward run without them (qwen3-1.7b's fp32 gradients are 6.9 GB; its mode-A minibatch run ran out of
    # an H100's 80 GB in that forward, e2e_h100_minibatch_qwen3-1.7b_s28_oom.log)
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        zero = lp.new_zeros(())
        dev = (ratio - 1).abs().max() if ratio.numel() else zero
        clipped = ((ratio - 1).abs() > clip).float().mean() if ratio.numel() else zero
    return StepResult(loss.detach(), lp.detach(), ent.detach().mean(), dev, clipped)
