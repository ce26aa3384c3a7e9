"""The full-depth model presets have Qwen3's published shapes (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B);
built on the CPU as configs only, never run here."""

from __future__ import annotations

import pytest

from tik_kernels.e2e.decode_bench import decode_floor_bytes
from tik_kernels.e2e.model import PRESETS, ModelConfig

# hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size
QWEN3 = {
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936),
}


@pytest.mark.parametrize("name", sorted(QWEN3))
def test_qwen3_presets_are_full_depth_with_the_real_shapes(name):
    c = PRESETS[name]
    assert (c.hidden, c.ffn, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab) == QWEN3[name]
    assert (c.rope_theta, c.eps, c.qk_norm) == (1_000_000.0, 1e-6, True)
    assert c.heads * c.head_dim != c.hidden or name == "qwen3-1.7b"  # 0.6b: attention width 2048 over hidden 1024


def test_parameter_counts():
    # the lm_head is the embedding table, as in the published checkpoints: their parameter counts
    assert PRESETS["qwen3-0.6b"].n_params() == pytest.approx(0.596e9, rel=0.01)
    assert PRESETS["qwen3-1.7b"].n_params() == pytest.approx(1.72e9, rel=0.01)
    assert PRESETS["qwen3-0.6b"].tie_embeddings and not PRESETS["tiny"].tie_embeddings


def test_decode_floor_bytes():
    c = ModelConfig(vocab=10, hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, ffn=8)
    b = decode_floor_bytes(c, batch=3, context=5)
    per_layer = 4 * 2 * (2 * 2 + 2 * 1) + 3 * 4 * 8 + 2 * 4 + 2 * 2
    assert b["weights"] == 2 * (2 * per_layer + 10 * 4 + 4 + 3 * 4)
    assert b["kv_read"] == 3 * 5 * 2 * 1 * 2 * 2 * 2
    assert b["total"] == b["weights"] + b["kv_read"] + b["kv_write"]
    # the weights of the embedding are not read whole: its rows count per sequence, not the table
    assert decode_floor_bytes(c.with_layers(0), 1, 1)["weights"] == 2 * (10 * 4 + 4 + 4)
    # qwen3-0.6b, 64 sequences at 256 tokens: 1.19 GB of weights, 1.88 GB of KV
    q = decode_floor_bytes(PRESETS["qwen3-0.6b"], 64, 256)
    assert q["weights"] == pytest.approx(1.19e9, rel=0.01) and q["kv_read"] == pytest.approx(1.879e9, rel=0.01)
