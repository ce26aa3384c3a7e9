"""`apply_tik(model)`: a transformers Llama / Qwen2 / Qwen3 model whose modules run TIK's kernels.

The model is patched in place, per instance (another model of the same class in the process is untouched),
and its parameters, state_dict, cache and generate() stay HF's:

* every RMSNorm (input, post-attention, final, Qwen3's per-head q_norm / k_norm) -> `rmsnorm`;
* every projection (q/k/v/o, gate/up/down) and the lm_head -> `linear`; a bias (Qwen2's q/k/v) is added
  afterwards as one bf16 elementwise add, the same op in every regime (HF fuses it into the matmul);
* the SwiGLU MLP -> two `linear`s (gate, up), their outputs concatenated to [T, 2F], `silu_mul`, `linear`
  (down). Two projections rather than one over a concatenated [2F, H] weight, so that gate_proj.weight and
  up_proj.weight remain the parameters an optimizer, FSDP or a checkpoint see; the cost is one copy of
  the [T, 2F] activations;
* the rotary embedding -> `rope` from each token's position (HF's cos/sin tables are not computed);
* attention -> `tik_attention`, registered as "tik" in transformers' AttentionInterface and set as the
  model's attention implementation;
* the base model's forward first computes the batch layout (`TikBatch`: positions from attention_mask,
  packing of padded rows, cache lengths) and hands it to every attention call.

Activations are flattened [B, S, H] -> [B * S, H] (row-major, a view): every kernel computes a row from that
row alone, so a token's bits do not depend on B, S, its padding or the regime (prefill, decode, training).
"""

from __future__ import annotations

import inspect
import types

import torch
import transformers
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache

from tik_kernels.hf.attention import tik_attention
from tik_kernels.hf.layout import TikUnsupported, make_batch
from tik_kernels.ops.linear import linear
from tik_kernels.ops.rmsnorm import rmsnorm
from tik_kernels.ops.rope import rope
from tik_kernels.ops.silu_mul import silu_mul

AttentionInterface.register("tik", tik_attention)

#: model_type -> the causal-LM and base-model class names apply_tik knows
SUPPORTED = {
    "llama": ("LlamaForCausalLM", "LlamaModel"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Model"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Model"),
}
_SUPPORTED_LINE = "apply_tik supports " + ", ".join(n for names in SUPPORTED.values() for n in names)

#: head dims the attention kernels are built for
_HEAD_DIMS = (16, 32, 64, 128, 256)


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = linear(x, self.weight)
    return y if self.bias is None else y + self.bias


def _rmsnorm_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return rmsnorm(x, self.weight, self.variance_epsilon)


def _mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_mul(torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)))


def _rotary_forward(self: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor | None = None):
    # the attention modules rotate from TikBatch.pos; nothing reads HF's cos/sin tables
    return None


def _attention_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings=None,
    attention_mask: torch.Tensor | None = None,
    past_key_values=None,
    cache=None,
    **kwargs,
):
    # transformers 5.17 names the cache past_key_values, 5.25 cache
    cache = cache if cache is not None else past_key_values
    batch = kwargs.get("tik_batch")
    if batch is None:
        raise TikUnsupported("a TIK attention module runs only inside its model's forward (apply_tik)")
    kwargs.pop("position_ids", None)
    B, S, _ = hidden_states.shape
    D = self.head_dim
    q = self.q_proj(hidden_states).view(B * S, -1, D)
    k = self.k_proj(hidden_states).view(B * S, -1, D)
    v = self.v_proj(hidden_states).view(B, S, -1, D).transpose(1, 2)
    if hasattr(self, "q_norm"):
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = rope(q, k, batch.pos.reshape(B * S), self._tik_theta)
    q = q.view(B, S, -1, D).transpose(1, 2)
    k = k.view(B, S, -1, D).transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
    attend = AttentionInterface().get_interface(self.config._attn_implementation, tik_attention)
    o, w = attend(
        self, q, k, v, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling, sliding_window=getattr(self, "sliding_window", None), **kwargs,
    )  # fmt: skip
    return self.o_proj(o.reshape(B, S, -1)), w


def _wrap_base_forward(base: torch.nn.Module) -> None:
    """Compute the forward's TikBatch before HF's own forward runs, and pass it down as a kwarg."""
    orig = base.forward
    names = [n for n, p in inspect.signature(orig).parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]

    def forward(*args, **kwargs):
        kw = dict(zip(names, args, strict=False))
        kw.update(kwargs)
        cache = kw.get("cache", kw.get("past_key_values"))
        if cache is not None and type(cache) is not DynamicCache:
            raise TikUnsupported(f"apply_tik supports DynamicCache (generate's default), got {type(cache).__name__}")
        ids, embeds = kw.get("input_ids"), kw.get("inputs_embeds")
        ref = ids if ids is not None else embeds
        if ref is None:
            return orig(**kw)
        past = cache.get_seq_length() if cache is not None else 0
        kw["tik_batch"] = make_batch(
            ref.shape[0], ref.shape[1], past, kw.get("attention_mask"), kw.get("position_ids"), ref.device
        )
        return orig(**kw)

    base.forward = forward


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise TikUnsupported(f"apply_tik supports the default RoPE only, got rope_type {rope_type!r}")
    if params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) != 1.0:
        raise TikUnsupported("apply_tik supports full-width RoPE only (partial_rotary_factor = 1)")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise TikUnsupported("apply_tik: the config has no rope_theta")
    return float(theta)


def _check(model: torch.nn.Module, base: torch.nn.Module) -> float:
    """The config checks; returns rope theta. Raises TikUnsupported with what is supported."""
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise TikUnsupported(f"apply_tik needs transformers 5 (tested: 5.17, 5.25), got {transformers.__version__}")
    config = model.config
    names = SUPPORTED.get(getattr(config, "model_type", None), ())
    if type(model).__name__ not in names:
        raise TikUnsupported(f"{_SUPPORTED_LINE}; got {type(model).__name__}")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.bfloat16}:
        got = sorted(map(str, dtypes))
        raise TikUnsupported(f"apply_tik takes a bfloat16 model (model.to(torch.bfloat16)), got {got}")
    if config.hidden_act != "silu":
        raise TikUnsupported(f"apply_tik supports the SwiGLU MLP (hidden_act 'silu'), got {config.hidden_act!r}")
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise TikUnsupported("apply_tik: sliding-window attention is not supported (use_sliding_window = False)")
    if getattr(config, "attention_dropout", 0.0):
        raise TikUnsupported("apply_tik: attention dropout is not supported (config.attention_dropout = 0)")
    if getattr(config, "pretraining_tp", 1) != 1:
        raise TikUnsupported("apply_tik: pretraining_tp > 1 is not supported")
    head_dim = base.layers[0].self_attn.head_dim
    if head_dim not in _HEAD_DIMS:
        raise TikUnsupported(f"apply_tik: head_dim {head_dim} is not one of {_HEAD_DIMS}")
    return _rope_theta(config)


def apply_tik(model: torch.nn.Module) -> torch.nn.Module:
    """Patch a transformers Llama / Qwen2 / Qwen3 model (causal LM or base) in place to run TIK's kernels.

    Returns the model. Raises TikUnsupported (a ValueError, one line) for anything it does not handle.
    """
    if getattr(model, "_tik_applied", False):
        return model
    base = getattr(model, "model", model)
    theta = _check(model, base)
    bind = types.MethodType
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            lin.forward = bind(_linear_forward, lin)
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        for norm in norms:
            norm.forward = bind(_rmsnorm_forward, norm)
        attn._tik_theta = theta
        attn.forward = bind(_attention_forward, attn)
        mlp.forward = bind(_mlp_forward, mlp)
    base.norm.forward = bind(_rmsnorm_forward, base.norm)
    base.rotary_emb.forward = bind(_rotary_forward, base.rotary_emb)
    if hasattr(model, "lm_head"):
        model.lm_head.forward = bind(_linear_forward, model.lm_head)
    _wrap_base_forward(base)
    model.set_attn_implementation("tik")
    model._tik_applied = True
    return model
