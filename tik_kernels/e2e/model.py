"""A Qwen3-style decoder (GQA, q/k RMSNorm, RoPE, SwiGLU) written against a kernel *backend*.

The same forward code runs on `StockBackend` (cuBLAS, SDPA, F.rms_norm, log_softmax: what
a trainer uses today) or `UnifiedBackend` (TIK's operators), both in `backends.py`. Activations are token-major:
a packed batch of T tokens is `[T, H]` whatever its origin (prefill, decode, training).

Parameters are fp32 master weights; every forward casts them to bf16, so rollout and trainer
read the very same bf16 bits.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from tik_kernels.e2e.safetensors_io import CheckpointError, load_file


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6
    #: per-head RMSNorm of q and k before the rotary embedding (Qwen3); Llama has none
    qk_norm: bool = True
    #: the lm_head is the embedding table (Qwen3-0.6B and -1.7B, `tie_word_embeddings`): one [vocab, hidden]
    #: parameter, "embed", read by the embedding and by the lm_head, its gradient the sum of both uses
    tie_embeddings: bool = False

    def with_layers(self, n: int) -> ModelConfig:
        return replace(self, layers=n)

    def n_params(self) -> int:
        H, D = self.hidden, self.head_dim
        layer = H * D * (self.heads * 2 + self.kv_heads * 2) + 3 * H * self.ffn + 2 * H + 2 * D * self.qk_norm
        return (1 if self.tie_embeddings else 2) * self.vocab * H + H + self.layers * layer


PRESETS: dict[str, ModelConfig] = {
    # CPU tests: runs in the Triton interpreter in seconds
    "tiny": ModelConfig(vocab=48, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=64, rope_theta=10_000.0),
    # GPU learning demo: small enough to learn the synthetic task by GRPO in minutes
    "small": ModelConfig(vocab=64, hidden=256, layers=4, heads=8, kv_heads=4, head_dim=32, ffn=768,
                         rope_theta=10_000.0),
    # real shapes, the lm_head tied to the embedding as in the published checkpoints (a caller may cut the layers)
    "qwen3-0.6b": ModelConfig(vocab=151936, hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=3072,
                              tie_embeddings=True),
    "qwen3-1.7b": ModelConfig(vocab=151936, hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144,
                              tie_embeddings=True),
}


def init_params(cfg: ModelConfig, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Random fp32 master weights (requires_grad), scaled so activations stay O(1).

    A tied table is scaled as an lm_head (logits of about unit size): the embedding's rows then start the residual
    stream small, which the first RMSNorm undoes."""
    g = torch.Generator().manual_seed(seed)
    H, D = cfg.hidden, cfg.head_dim

    def w(*shape, std):
        return (torch.randn(*shape, generator=g) * std).to(device)

    if cfg.tie_embeddings:
        p: dict[str, torch.Tensor] = {"embed": w(cfg.vocab, H, std=1 / math.sqrt(H))}
    else:
        p = {"embed": w(cfg.vocab, H, std=1.0), "lm_head": w(cfg.vocab, H, std=1 / math.sqrt(H))}
    p["norm"] = torch.ones(H, device=device)
    for i in range(cfg.layers):
        s_in, s_attn, s_ffn = 1 / math.sqrt(H), 1 / math.sqrt(cfg.heads * D), 1 / math.sqrt(cfg.ffn)
        p |= {
            f"l{i}.ln1": torch.ones(H, device=device),
            # q, k and v stacked in one weight: one projection launch instead of three (the rows of q, k and v are
            # the same sums either way: the linear's tree does not depend on the output width)
            f"l{i}.wqkv": torch.cat([w(cfg.heads * D, H, std=s_in), w(cfg.kv_heads * D, H, std=s_in),
                                     w(cfg.kv_heads * D, H, std=s_in)]),
            f"l{i}.wo": w(H, cfg.heads * D, std=s_attn / math.sqrt(2 * cfg.layers)),
            f"l{i}.ln2": torch.ones(H, device=device),
            f"l{i}.w_gate_up": w(2 * cfg.ffn, H, std=s_in),
            f"l{i}.w_down": w(H, cfg.ffn, std=s_ffn / math.sqrt(2 * cfg.layers)),
        }
        if cfg.qk_norm:
            p |= {f"l{i}.q_norm": torch.ones(D, device=device), f"l{i}.k_norm": torch.ones(D, device=device)}
    for t in p.values():
        t.requires_grad_(True)
    return p


#: Hugging Face `model_type`s whose checkpoints map onto this decoder (no biases, default rotary embedding)
HF_MODEL_TYPES = ("qwen3", "llama")


def load_hf(directory: str | Path, device: str = "cpu") -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load a Hugging Face Qwen3/Llama-style checkpoint (config.json + *.safetensors) from a local directory."""
    d = Path(directory)
    try:
        hf = json.loads((d / "config.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{d}: no config.json") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{d}/config.json: {e}") from None
    kind = hf.get("model_type")
    if kind not in HF_MODEL_TYPES:
        raise CheckpointError(f"{d}: model_type {kind!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)})")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise CheckpointError(f"{d}: projections with biases are not supported by this model")
    # transformers 5 writes rope_parameters {rope_type, rope_theta}; 4.x wrote rope_theta / rope_scaling
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise CheckpointError(f"{d}: rope type {rope.get('rope_type', rope.get('type'))!r} is not supported "
                              "(only the default rotary embedding)")
    try:
        heads = hf["num_attention_heads"]
        cfg = ModelConfig(
            vocab=hf["vocab_size"], hidden=hf["hidden_size"], layers=hf["num_hidden_layers"], heads=heads,
            kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            ffn=hf["intermediate_size"], rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0))),
            eps=float(hf.get("rms_norm_eps", 1e-6)), qk_norm=kind == "qwen3",
        )
    except KeyError as e:
        raise CheckpointError(f"{d}/config.json lacks {e.args[0]}") from None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{d}: no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd |= load_file(f)
    # save_pretrained leaves a tied lm_head out of the files
    cfg = replace(cfg, tie_embeddings=bool(hf.get("tie_word_embeddings")) or "lm_head.weight" not in sd)

    def get(name: str) -> torch.Tensor:
        for key in (name, "model." + name):
            if key in sd:
                return sd[key].float()
        raise CheckpointError(f"{d}: checkpoint lacks {name}")

    p = {"embed": get("embed_tokens.weight"), "norm": get("norm.weight")}
    biases = sorted(k for k in sd if k.endswith(".bias"))
    if biases:
        raise CheckpointError(f"{d}: checkpoint has biases ({biases[0]}, ...), which this model does not support")
    if not cfg.tie_embeddings:
        p["lm_head"] = sd["lm_head.weight"].float()
    for i in range(cfg.layers):
        pre = f"layers.{i}."
        p[f"l{i}.ln1"] = get(pre + "input_layernorm.weight")
        p[f"l{i}.wqkv"] = torch.cat([get(pre + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
        p[f"l{i}.wo"] = get(pre + "self_attn.o_proj.weight")
        if cfg.qk_norm:
            p[f"l{i}.q_norm"] = get(pre + "self_attn.q_norm.weight")
            p[f"l{i}.k_norm"] = get(pre + "self_attn.k_norm.weight")
        p[f"l{i}.ln2"] = get(pre + "post_attention_layernorm.weight")
        p[f"l{i}.w_gate_up"] = torch.cat([get(pre + "mlp.gate_proj.weight"), get(pre + "mlp.up_proj.weight")])
        p[f"l{i}.w_down"] = get(pre + "mlp.down_proj.weight")
    return cfg, {k: v.to(device).requires_grad_(True) for k, v in p.items()}


def config_dict(cfg: ModelConfig) -> dict:
    return asdict(cfg)


# ----------------------------------------------------------------------------- the decoder


def _foreach_cast(src: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Each tensor cast to `dtype` as `Tensor.to` casts it, in one multi-tensor copy (on CUDA one kernel where the
    tensors share their source and destination dtypes)."""
    out = [torch.empty_like(t, dtype=dtype) for t in src]
    torch._foreach_copy_(out, src)
    return out


class _CastGroup(torch.autograd.Function):
    """fp32 masters to bf16 copies in one multi-tensor launch (`torch._foreach_copy_`: on CUDA one kernel for a
    layer's weights where it takes several of the same source and destination dtype, else one copy each), and in
    the backward their bf16 gradients to fp32 the same way. Each element is cast exactly as `Tensor.to` casts it
    (round to nearest even; bf16 to fp32 exact), so the weights, gradients and updates are the bits per-tensor casts
    give, in one launch a layer instead of one a weight. A group's backward runs once all its outputs' gradients
    are in: a layer's weights form one group, so its bf16 gradients are converted once that layer's backward is
    done."""

    @staticmethod
    def forward(ctx, *masters: torch.Tensor):
        return tuple(_foreach_cast(list(masters), torch.bfloat16))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        return tuple(_foreach_cast(list(grads), torch.float32))


def cast_groups(names) -> list[list[str]]:
    """The parameter names in cast groups: each layer's ("l3.wqkv", "l3.wo", ...) together, in order of first
    appearance; every other name (the embedding, the final norm, an untied lm_head) alone, so that a gradient
    produced early in the backward (the lm_head's) is not held until the last one (the embedding's)."""
    groups: dict[str, list[str]] = {}
    for k in names:
        layer = re.match(r"l\d+\.", k)
        groups.setdefault(layer.group() if layer else k, []).append(k)
    return list(groups.values())


def bf16_weights(params: dict[str, torch.Tensor], grad: bool) -> dict[str, torch.Tensor]:
    """The bf16 weights every kernel reads; with `grad` the cast is part of the autograd graph.

    The casts go a layer at a time (`_CastGroup`, `cast_groups`): the same bits as a cast per tensor, in one
    launch a layer on CUDA. A tied model's "lm_head" is its "embed" (no parameter of its own): the same bf16 tensor
    without `grad`; with it, a second cast of the same bits, so that the two uses' gradients meet in the fp32
    master's accumulation, not summed in bf16 first."""
    if grad:
        W = {}
        for names in cast_groups(params):
            W.update(zip(names, _CastGroup.apply(*(params[k] for k in names)), strict=True))
        if "lm_head" not in W:
            W["lm_head"] = params["embed"].to(torch.bfloat16)
        return W
    with torch.no_grad():
        W = dict(zip(params, _foreach_cast([v.detach() for v in params.values()], torch.bfloat16), strict=True))
    W.setdefault("lm_head", W["embed"])
    return W


class KVCache:
    """Per-layer `[slots, Hk, max_len, D]` bf16 caches of roped keys and values, slot-major."""

    def __init__(self, cfg: ModelConfig, slots: int, max_len: int, device: str):
        shape = (cfg.layers, slots, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.v = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.max_len = max_len

    def move(self, src: int, dst: int) -> None:
        """Compact the active slots: slot `src`'s contents go to slot `dst`."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    #: slots one gather-and-scatter of `copy_prefix` moves at a time (its temporary holds their prefixes)
    COPY_SLOTS = 32

    def copy_prefix(self, src: list[int], dst: list[int], lens: list[int]) -> None:
        """Slot dst[j] gets slot src[j]'s first lens[j] positions, every layer (a prompt prefilled once for several
        requests): one gather and one scatter of keys and of values per prompt length (a GRPO group's copies share
        theirs) and at most COPY_SLOTS slots."""
        by_len: dict[int, list[int]] = {}
        for j, n in enumerate(lens):
            by_len.setdefault(n, []).append(j)
        for n, js in by_len.items():
            for a in range(0, len(js), self.COPY_SLOTS):
                part = js[a:a + self.COPY_SLOTS]
                s = to_device([src[j] for j in part], self.k.device)  # pinned and asynchronous: no host wait
                d = to_device([dst[j] for j in part], self.k.device)
                for cache in (self.k, self.v):
                    cache[:, d, :, :n] = cache[:, s, :, :n]


def _qkv(cfg: ModelConfig, be, W, i: int, x: torch.Tensor, pos: torch.Tensor, fill=None):
    """q, k, v of layer i, q and k normed (Qwen3) and roped; `fill` (k_cache, v_cache, slots) also writes the roped k
    and v into that layer's caches, token t at [slots[t], :, pos[t]]."""
    T, D = x.shape[0], cfg.head_dim
    q, k, v = be.linear(x, W[f"l{i}.wqkv"]).split([cfg.heads * D, cfg.kv_heads * D, cfg.kv_heads * D], dim=-1)
    q, k, v = q.view(T, cfg.heads, D), k.view(T, cfg.kv_heads, D), v.view(T, cfg.kv_heads, D)
    if cfg.qk_norm and fill is not None and getattr(be, "fused_qk_rope", False):  # one launch (UnifiedBackend)
        return (*be.qk_norm_rope_cache(q, W[f"l{i}.q_norm"], k, W[f"l{i}.k_norm"], cfg.eps, v, pos, cfg.rope_theta,
                                       *fill), v)
    if cfg.qk_norm:
        q, k = be.qk_norm(q, W[f"l{i}.q_norm"], k, W[f"l{i}.k_norm"], cfg.eps)
    if fill is None:
        q, k = be.rope(q, k, pos, cfg.rope_theta)
    else:
        q, k = be.rope_cache(q, k, v, pos, cfg.rope_theta, *fill)
    return q, k, v


def _mlp(cfg: ModelConfig, be, W, i: int, x: torch.Tensor) -> torch.Tensor:
    w = W[f"l{i}.w_gate_up"]
    # a backend that makes the two calls one launch where it can (UnifiedBackend's `fused_mlp`), else the two
    h = be.gate_up_silu(x, w) if getattr(be, "fused_mlp", False) else None
    if h is None:
        h = be.silu_mul(be.linear(x, w))
    return be.linear(h, W[f"l{i}.w_down"])


def forward(cfg: ModelConfig, be, W: dict[str, torch.Tensor], ids: torch.Tensor, pos: torch.Tensor,
            attend, fill=None) -> torch.Tensor:
    """Final-normed hidden states `[T, H]` for tokens `ids` at positions `pos`.

    `attend(i, q, k, v) -> [T, Hq, D]` supplies the attention of layer i: varlen causal over a
    packed batch, or a decode step against the KV cache. `fill(i) -> (k_cache, v_cache, slots)`: the
    caches the rope of layer i also fills (the backend's `rope_cache`), before `attend` runs.
    """
    h = be.embedding(ids, W["embed"])
    residual = None
    T = ids.shape[0]
    for i in range(cfg.layers):
        if residual is None:
            residual, x = h, be.rmsnorm(h, W[f"l{i}.ln1"], cfg.eps)
        else:
            x, residual = be.add_rmsnorm(h, residual, W[f"l{i}.ln1"], cfg.eps)
        q, k, v = _qkv(cfg, be, W, i, x, pos, fill(i) if fill is not None else None)
        a = attend(i, q, k, v)
        h = be.linear(a.reshape(T, cfg.heads * cfg.head_dim), W[f"l{i}.wo"])
        x, residual = be.add_rmsnorm(h, residual, W[f"l{i}.ln2"], cfg.eps)
        h = _mlp(cfg, be, W, i, x)
    out, _ = be.add_rmsnorm(h, residual, W["norm"], cfg.eps)
    return out


def to_device(values: list[int] | torch.Tensor, device, dtype=torch.int64) -> torch.Tensor:
    """A host list (or CPU tensor) as a device tensor without waiting for the GPU (pinned memory, asynchronous
    copy)."""
    t = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def forward_packed(cfg: ModelConfig, be, W, ids: torch.Tensor, cu_seqlens: torch.Tensor,
                   cache: KVCache | None = None, slots: list[int] | None = None,
                   lens: list[int] | None = None) -> torch.Tensor:
    """Packed varlen forward over whole sequences (trainer; rollout prefill, which also fills `cache`).

    `lens` are the sequence lengths on the host (the caller packed them; passing them keeps the forward
    free of host syncs); without them they are read back from `cu_seqlens` once."""
    if lens is None:
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    pos = to_device([p for n in lens for p in range(n)], ids.device)
    if cache is not None:
        # each token's cache slot: one scatter per layer for all sequences (a copy per sequence and layer cost a
        # prefill of 64 requests 3,584 launches and their host time)
        tok_slot = to_device([slot for slot, n in zip(slots, lens, strict=True) for _ in range(n)], ids.device)

    def attend(i, q, k, v):
        return be.attention_varlen(q, k, v, cu_seqlens, lens)

    fill = (lambda i: (cache.k[i], cache.v[i], tok_slot)) if cache is not None else None
    return forward(cfg, be, W, ids, pos, attend, fill)


def forward_decode(cfg: ModelConfig, be, W, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                   kv_len: int | None = None) -> torch.Tensor:
    """One decode step for B active requests held in cache slots 0..B-1; token b sits at position pos[b].

    `kv_len` (host int) bounds the cache entries any request reads (the longest context + 1); default: the
    cache's capacity. The unified kernel ignores it (its launch depends on the capacity only)."""
    B = ids.shape[0]
    rows = torch.arange(B, device=ids.device)
    lens = (pos + 1).to(torch.int32)
    kv_len = kv_len or cache.max_len

    def attend(i, q, k, v):
        # the rope wrote this step's k and v into the cache (fill)
        o = be.attention_decode(q[:, :, None, :], cache.k[i, :B], cache.v[i, :B], lens, kv_len)
        return o[:, :, 0, :]

    return forward(cfg, be, W, ids, pos, attend, lambda i: (cache.k[i], cache.v[i], rows))
