"""apply_tik on a GPU at real widths: a 4-layer Qwen3 of the 0.6B config's widths, batched sampled generate over
prompts of different lengths, then the training forward over another batch (two generations together).
Patched: every generated token's log-prob and logit row bitwise equal; stock (SDPA, cuBLAS), given the same
positions: some differ (on the H200 stock bf16 kernels change their reduction order with the batch shape)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tik_kernels.hf import apply_tik, generated_logprobs, token_logprobs

pytestmark = pytest.mark.gpu

LENGTHS = (100, 37, 64, 5)
N_NEW = 16


def _model() -> torch.nn.Module:
    cfg = Qwen3Config(
        vocab_size=8192, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rope_theta=1e6, pad_token_id=0, bos_token_id=1, eos_token_id=None,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        return Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()


def _run(model, patched: bool) -> tuple[int, int, int]:
    """(tokens, equal log-probs, equal logit rows) between generate and the training forward."""
    width = max(LENGTHS)
    ids = torch.randint(3, 8192, (len(LENGTHS), width), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(width)[None, :] >= width - torch.tensor(LENGTHS)[:, None]).long()
    ids, mask = (ids * mask).cuda(), mask.cuda()
    gens = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        gens.append(model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=N_NEW, do_sample=True, output_logits=True,
            output_hidden_states=True, return_dict_in_generate=True, pad_token_id=0,
        ))  # fmt: skip
    seq = torch.cat([g.sequences for g in gens])
    full = torch.cat([mask, torch.ones_like(gens[0].sequences[:, width:])], 1).repeat(2, 1)
    with torch.no_grad():
        if patched:
            hidden = model.model(input_ids=seq, attention_mask=full).last_hidden_state
            logits = model.lm_head(hidden).float()
            logp = token_logprobs(hidden[:, :-1], model.lm_head.weight, seq[:, 1:])
        else:
            pos = (full.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=seq, attention_mask=full, position_ids=pos).logits.float()
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, seq[:, 1:, None])[..., 0]
    B, tokens, lp_eq, row_eq = len(LENGTHS), 0, 0, 0
    for i, g in enumerate(gens):
        if patched:
            gen_lp = generated_logprobs(model, g)
        else:
            gen_lp = torch.log_softmax(torch.stack(g.logits, 1), -1).gather(-1, g.sequences[:, -N_NEW:, None])[..., 0]
        trn = logp[i * B : (i + 1) * B, width - 1 : width - 1 + N_NEW]
        lp_eq += int((gen_lp.view(torch.int32) == trn.view(torch.int32)).sum())
        row_eq += sum(torch.equal(g.logits[j][b], logits[i * B + b, width - 1 + j]) for j in range(N_NEW)
                      for b in range(B))  # fmt: skip
        tokens += B * N_NEW
    return tokens, lp_eq, row_eq


def test_patched_bitwise_stock_not():
    stock = _model()
    tokens, lp_eq, row_eq = _run(stock, patched=False)
    assert lp_eq < tokens, f"stock: all {tokens} log-probs equal"
    tik = apply_tik(_model())
    tokens, lp_eq, row_eq = _run(tik, patched=True)
    assert lp_eq == tokens and row_eq == tokens, (tokens, lp_eq, row_eq)
