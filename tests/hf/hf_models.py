"""Tiny random-initialised Llama / Qwen2 / Qwen3 models for the apply_tik tests (bf16, CPU)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

#: family -> (config class, model class, layers); Qwen3 (q/k norm) gets two layers, the others one (the
#: interpreter is slow; a second layer runs the same kernels again)
FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, 2),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, 1),
    "llama": (LlamaConfig, LlamaForCausalLM, 1),
}
PAD = 0


def tiny_model(family: str, layers: int | None = None, **overrides) -> torch.nn.Module:
    """hidden 64, 4 query / 2 KV heads of 16, MLP 128, vocab 128; Qwen2 has its q/k/v biases."""
    config_cls, model_cls, default_layers = FAMILIES[family]
    kw = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers or default_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        pad_token_id=PAD, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    kw.update(overrides)
    torch.manual_seed(0)
    return model_cls(config_cls(**kw)).to(torch.bfloat16).eval()
