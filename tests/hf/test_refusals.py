"""What apply_tik refuses (one-line TikUnsupported naming what is supported), the batch layout it derives from
attention_mask, that patching one model leaves another untouched, and a chunk of tokens on top of a cache.
Only the last two tests run kernels (a few 1-layer forwards)."""

from __future__ import annotations

import pytest
import torch
from hf_models import tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

from tik_kernels.hf import TikUnsupported, apply_tik
from tik_kernels.hf.attention import tik_attention
from tik_kernels.hf.layout import make_batch


def _refused(model, *words):
    with pytest.raises(TikUnsupported) as e:
        apply_tik(model)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not getattr(model, "_tik_applied", False)


def test_unsupported_architecture_names_the_supported_ones():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).to(torch.bfloat16)
    _refused(gpt2, "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@pytest.mark.parametrize(
    "family,overrides,words",
    [
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, ["default RoPE"]),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, ["sliding"]),
        ("qwen3", {"hidden_act": "gelu"}, ["silu"]),
        ("qwen3", {"attention_dropout": 0.1}, ["dropout"]),
        ("llama", {"head_dim": 8, "num_attention_heads": 8}, ["head_dim 8"]),
    ],
    ids=["rope_scaling", "sliding_window", "gelu", "attention_dropout", "head_dim"],
)
def test_refused_configs(family, overrides, words):
    _refused(tiny_model(family, layers=1, **overrides), *words)


def test_refuses_float32():
    _refused(tiny_model("qwen3", layers=1).float(), "bfloat16")


def test_patches_one_instance_only():
    a, b = tiny_model("qwen3", layers=1), tiny_model("qwen3", layers=1)
    assert apply_tik(a) is a and apply_tik(a) is a
    assert a.config._attn_implementation == "tik" and b.config._attn_implementation != "tik"
    assert "forward" in vars(a.model.layers[0].mlp.gate_proj) and "forward" not in vars(b.model.layers[0].mlp.gate_proj)
    assert a.state_dict().keys() == b.state_dict().keys()


def test_attention_needs_the_models_layout():
    q = torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(TikUnsupported, match="apply_tik"):
        tik_attention(None, q, q[:, :2], q[:, :2], None, scaling=0.25)


def test_layout_unpadded_is_dense():
    b = make_batch(2, 3, 0, None, None, torch.device("cpu"))
    assert b.dense and b.pos.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_layout_packs_left_and_right_padding():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1]])
    b = make_batch(3, 4, 0, mask, None, torch.device("cpu"))
    assert not b.dense and b.max_len == 4
    assert b.pack_idx.tolist() == [1, 2, 4, 5, 6, 7, 11] and b.cu_seqlens.tolist() == [0, 2, 6, 7]
    assert b.pos[mask.bool()].tolist() == [0, 1, 0, 1, 2, 3, 0]


def test_layout_decode_gathers_left_padded_keys():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    b = make_batch(2, 1, 4, mask, torch.tensor([[2], [4]]), torch.device("cpu"))
    assert b.lens.tolist() == [3, 5] and b.pos.tolist() == [[2], [4]]
    assert b.key_index[0, :3].tolist() == [2, 3, 4] and b.key_index[1].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "batch,new,past,mask,pos,words",
    [
        (1, 4, 0, [[1, 0, 1, 1]], None, "gap"),
        (1, 1, 3, [[1, 1, 0, 1]], None, "left"),
        (1, 1, 3, [[1, 1, 1, 0]], None, "left"),
        (1, 3, 0, [[1, 1, 1]], [[0, 2, 3]], "position_ids"),
        (2, 3, 0, [[1, 1, 1]], None, "attention_mask"),
    ],
    ids=["gap", "right_pad_with_cache", "new_token_padded", "packed_positions", "mask_shape"],
)
def test_layout_refusals(batch, new, past, mask, pos, words):
    pos = None if pos is None else torch.tensor(pos)
    with pytest.raises(TikUnsupported, match=words):
        make_batch(batch, new, past, torch.tensor(mask), pos, torch.device("cpu"))


def test_right_padded_generate_is_refused():
    model = apply_tik(tiny_model("qwen3", layers=1))
    ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    with pytest.raises(TikUnsupported, match="padding_side = 'left'"):
        model.generate(input_ids=ids, attention_mask=(ids != 0).long(), max_new_tokens=2, pad_token_id=0)


# transformers 5.25 renamed the kwarg to `cache`; 5.17 knows only `past_key_values`
@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")
def test_several_new_tokens_on_a_cache_match_the_full_forward():
    """A chunk of new tokens on top of a DynamicCache (one decode call per token, left-padded rows gathered)
    gives the rows of one forward over the whole sequences, bit for bit."""
    from transformers import DynamicCache

    model = apply_tik(tiny_model("llama", layers=1))
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = (ids != 0).long()
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :4], attention_mask=mask[:, :4], past_key_values=cache, use_cache=True)
        part = model(input_ids=ids[:, 4:], attention_mask=mask, past_key_values=cache, use_cache=True).logits
    assert torch.equal(part.view(torch.int16), full[:, 4:].view(torch.int16))
