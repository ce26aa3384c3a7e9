"""Per-token log-probs from hidden states with TIK's fused `logprob` kernel (no [T, V] fp32 logits).

`token_logprobs` is the training side; `generated_logprobs` reads the same quantity out of a `generate`
call (its last-layer hidden states), so a rollout's log-probs are bitwise the trainer's when the model is
patched by `apply_tik`: the hidden rows are equal bit for bit and the kernel computes a row from that row.
"""

from __future__ import annotations

import torch

from tik_kernels.ops.logprob import logprob


def token_logprobs(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log_softmax(hidden @ W.T / temperature) at `targets`: hidden [..., H], targets [...] -> fp32 [...]."""
    return logprob(hidden, lm_head_weight, targets, temperature)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-prob of every next token of input_ids [B, S] under a causal LM: fp32 [B, S - 1] (differentiable).

    The trainer's forward: the base model's last hidden states, then the fused kernel against lm_head.
    Entries whose target is padding are computed but meaningless; mask them with attention_mask[:, 1:].
    """
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return token_logprobs(hidden[:, :-1], model.lm_head.weight, input_ids[:, 1:], temperature)


def generated_logprobs(model: torch.nn.Module, out, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs [B, N] of the N tokens a `generate(..., output_hidden_states=True,
    return_dict_in_generate=True)` call produced, from its last-layer hidden states."""
    if not getattr(out, "hidden_states", None):
        raise ValueError("generated_logprobs needs generate(output_hidden_states=True, return_dict_in_generate=True)")
    n = len(out.hidden_states)
    hidden = torch.stack([step[-1][:, -1, :] for step in out.hidden_states], dim=1)
    return token_logprobs(hidden, model.lm_head.weight, out.sequences[:, -n:], temperature)
