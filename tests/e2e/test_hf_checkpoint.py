"""Checkpoints written by `transformers` itself (`save_pretrained`, sharded safetensors) load into the
e2e model and compute transformers' own logits.

Tolerance: our forward reads bf16 weights and computes in bf16 with fp32 accumulation; transformers
runs the same random-init model in fp32. The logits must agree to 3% of their RMS (bf16 has 8 bits of
mantissa: ~0.4% per rounding, over 2 layers), and the loaded weights are the checkpoint's bit for bit.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tik_kernels.e2e.backends import StockBackend  # noqa: E402
from tik_kernels.e2e.model import bf16_weights, forward_packed, load_hf  # noqa: E402
from tik_kernels.e2e.safetensors_io import CheckpointError  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, rms_norm_eps=1e-6, tie_word_embeddings=False)


def _save(tmp_path, family: str, **over):
    torch.manual_seed(42)
    if family == "qwen3":
        cfg = transformers.Qwen3Config(**(TINY | {"head_dim": 16, "rope_theta": 1_000_000.0} | over))
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**(TINY | {"rope_theta": 500_000.0} | over))
        model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    model.save_pretrained(tmp_path, max_shard_size="20KB")  # several shards, as real checkpoints come
    return model


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("tied", [False, True], ids=["lm_head", "tied"])
def test_transformers_checkpoint_matches_transformers_logits(tmp_path, family, tied):
    model = _save(tmp_path, family, tie_word_embeddings=tied)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    mc, params = load_hf(tmp_path)
    assert (mc.layers, mc.heads, mc.kv_heads) == (2, 4, 2)
    assert mc.rope_theta == model.config.rope_parameters["rope_theta"] if hasattr(model.config, "rope_parameters") \
        else model.config.rope_theta
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8]])
    with torch.no_grad():
        ref = model(ids).logits[0].float()
        W = bf16_weights(params, grad=False)
        hidden = forward_packed(mc, StockBackend(), W, ids[0], torch.tensor([0, ids.shape[1]], dtype=torch.int32))
        ours = (hidden.float() @ W["lm_head"].float().T)
    rel = (ours - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert rel < 0.03, f"logits differ from transformers' by {rel:.3%} RMS"
    # the same argmax almost everywhere: a wrong rope theta or a swapped projection would break this
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.75


def test_unsupported_checkpoints_are_refused(tmp_path):
    _save(tmp_path, "llama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    for change, match in ((dict(model_type="mistral"), "model_type 'mistral' is not supported"),
                          (dict(attention_bias=True), "biases"),
                          (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
                           "rope type 'yarn'")):
        (tmp_path / "config.json").write_text(json.dumps(cfg | change))
        with pytest.raises(CheckpointError, match=match):
            load_hf(tmp_path)
