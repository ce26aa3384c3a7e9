"""Real model configurations that the operators' workload cells are derived from.

Shapes from the models' published config.json files. Frozen: contracts import these, so a
derivation can never shrink the shapes it is timed on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    rms_eps: float = 1e-6
    qk_norm: bool = False

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim


QWEN3_0_6B = ModelShape("qwen3-0.6b", 1024, 3072, 16, 8, 128, 151936, 1e6, qk_norm=True)
QWEN3_8B = ModelShape("qwen3-8b", 4096, 12288, 32, 8, 128, 151936, 1e6, qk_norm=True)
LLAMA3_8B = ModelShape("llama3-8b", 4096, 14336, 32, 8, 128, 128256, 5e5, rms_eps=1e-5)

MODELS = (QWEN3_0_6B, QWEN3_8B, LLAMA3_8B)

#: rollout decode batch sizes (tokens per decode step)
DECODE_BATCHES = (1, 8, 64, 256)
#: prefill / training micro-batch token counts (packed sequences)
TRAIN_TOKENS = (1024, 4096, 16384)
