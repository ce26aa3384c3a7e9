"""TIK's kernels inside a transformers model: `model = apply_tik(model)` for Llama, Qwen2 and Qwen3.

    from tik_kernels.hf import apply_tik, token_logprobs
    model = apply_tik(model)       # bf16 LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM (or base model)
    logp = token_logprobs(hidden, model.lm_head.weight, targets)   # fused, fp32, no [T, V] logits

Needs transformers 5 (the `hf` extra).
"""

from tik_kernels.hf.layout import TikBatch, TikUnsupported
from tik_kernels.hf.logprobs import generated_logprobs, sequence_logprobs, token_logprobs
from tik_kernels.hf.patch import SUPPORTED, apply_tik

__all__ = [
    "SUPPORTED",
    "TikBatch",
    "TikUnsupported",
    "apply_tik",
    "generated_logprobs",
    "sequence_logprobs",
    "token_logprobs",
]
