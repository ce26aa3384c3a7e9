"""Mode A's packed attention: torch's flash varlen kernel where this torch has it (`model.varlen_flash`), chosen once
by a small case against the padded SDPA path (`StockBackend.varlen_probe`), else SDPA over a padded batch.

torch's varlen kernel is CUDA's, so here it is a stand-in with each signature torch has had: causal attention per
sequence, computed independently of the padded path."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import tik_kernels  # noqa: F401
from tik_kernels.e2e.backends import StockBackend, varlen_flash

varlen_mod = pytest.importorskip("torch.nn.attention.varlen")


def _per_sequence(q, k, v, cu):
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (t[a:b].transpose(0, 1)[None].float() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        outs.append(o[0].transpose(0, 1).to(q.dtype))
    return torch.cat(outs)


def _stand_ins(calls: list):
    """varlen_attn as torch 2.9/2.10 (is_causal, no GQA), 2.11 (window_size) and 2.12+ (window_size, enable_gqa)."""

    def v210(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        assert key.shape[1] == query.shape[1], "no GQA in this release: the KV heads come repeated"
        calls.append({"is_causal": is_causal, "cu_dtype": cu_seq_q.dtype, "max": (max_q, max_k)})
        return _per_sequence(query, key, value, cu_seq_q)

    def v211(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
             window_size=(-1, -1)):
        assert key.shape[1] == query.shape[1]
        calls.append({"window_size": window_size, "cu_dtype": cu_seq_q.dtype, "max": (max_q, max_k)})
        return _per_sequence(query, key, value, cu_seq_q)

    def v212(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
             window_size=(-1, -1), enable_gqa=False):
        calls.append({"window_size": window_size, "enable_gqa": enable_gqa, "kv_heads": key.shape[1]})
        return _per_sequence(query, key, value, cu_seq_q)

    return {"2.10": v210, "2.11": v211, "2.12": v212}


def _packed(lens, hq=4, hk=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    qkv = torch.randn(T, hq + 2 * hk, d, generator=g).to(torch.bfloat16)
    q, k, v = qkv.split([hq, hk, hk], dim=1)  # views of one stacked projection, as the trainer has them
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    return q, k, v, cu


@pytest.mark.parametrize("release", ["2.10", "2.11", "2.12"])
def test_varlen_path_takes_each_release_s_keywords_and_matches_the_padded_path(monkeypatch, release):
    calls: list = []
    monkeypatch.setattr(varlen_mod, "varlen_attn", _stand_ins(calls)[release])
    lens = [3, 7, 5]
    q, k, v, cu = _packed(lens)
    be = StockBackend(varlen=True)
    got = be.attention_varlen(q, k, v, cu, lens)
    assert be.attention_path == "varlen_flash" and len(calls) == 1
    call = calls[0]
    if release == "2.10":
        assert call["is_causal"] is True
    else:
        assert call["window_size"] == (-1, 0)  # causal
    if release == "2.12":
        assert call["enable_gqa"] is True and call["kv_heads"] == k.shape[1]  # no copy of the KV heads
    else:
        assert call["cu_dtype"] == torch.int32 and call["max"] == (7, 7)
    want = StockBackend(varlen=False).attention_varlen(q, k, v, cu, lens)
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_a_torch_without_a_causal_varlen_kernel_keeps_the_padded_path(monkeypatch):
    def no_causal(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        raise AssertionError("never called")

    monkeypatch.setattr(varlen_mod, "varlen_attn", no_causal)
    assert varlen_flash() is None
    lens = [4, 6]
    q, k, v, cu = _packed(lens)
    be = StockBackend(varlen=True)
    be.attention_varlen(q, k, v, cu, lens)
    assert be.attention_path == "sdpa_padded (this torch has no varlen_attn)"


def test_auto_keeps_the_padded_path_off_cuda_and_says_why():
    lens = [4, 6]
    q, k, v, cu = _packed(lens)
    be = StockBackend()
    got = be.attention_varlen(q, k, v, cu, lens)
    assert be.attention_path.startswith("sdpa_padded (")
    assert torch.equal(got, StockBackend(varlen=False).attention_varlen(q, k, v, cu, lens))
    assert StockBackend(varlen=False).attention_path is None  # chosen at the first call


def test_the_probe_accepts_a_right_kernel_and_names_what_is_wrong_with_others(monkeypatch):
    q, k, v, _ = _packed([4, 6])
    be = StockBackend()
    calls: list = []
    monkeypatch.setattr(varlen_mod, "varlen_attn", _stand_ins(calls)["2.12"])
    assert be.varlen_probe(varlen_flash(), q, k, v) is None
    # mode A's first packed call is the rollout's prefill, without gradients: the probe turns them on for its case
    with torch.no_grad():
        assert be.varlen_probe(varlen_flash(), q, k, v) is None
    with torch.inference_mode():
        assert be.varlen_probe(varlen_flash(), q, k, v) is None

    def wrong(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False):
        return _per_sequence(query, key, value, cu_seq_q) + 1.0

    monkeypatch.setattr(varlen_mod, "varlen_attn", wrong)
    assert "differs from the padded path" in be.varlen_probe(varlen_flash(), q, k, v)

    def missing(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1)):
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.\nmore")

    monkeypatch.setattr(varlen_mod, "varlen_attn", missing)
    why = be.varlen_probe(varlen_flash(), q, k, v)
    assert why == "RuntimeError: FlashAttention only supports Ampere GPUs or newer."  # its first line

    def no_grad_kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1)):
        with torch.no_grad():
            out = _per_sequence(query, key, value, cu_seq_q)
        return out.requires_grad_()  # a leaf: the inputs get no gradient

    monkeypatch.setattr(varlen_mod, "varlen_attn", no_grad_kernel)
    assert be.varlen_probe(varlen_flash(), q, k, v) == "RuntimeError: no finite gradient"


def test_this_torch_s_varlen_attn_is_one_the_wrapper_reads():
    """The installed torch's signature names a causal keyword the wrapper knows."""
    params = inspect.signature(varlen_mod.varlen_attn).parameters
    assert "window_size" in params or "is_causal" in params
    assert varlen_flash() is not None


@pytest.mark.gpu
def test_on_the_gpu_mode_a_runs_the_varlen_kernel_where_torch_has_one():
    """At qwen3's heads (16 / 8, head dim 128) and an RL minibatch's lengths: mode A's packed attention goes through
    torch's flash varlen kernel where this torch has one, agrees with the padded path and has gradients."""
    lens = [48, 200, 97, 288, 51]
    q, k, v, cu = (t.cuda() for t in _packed(lens, hq=16, hk=8, d=128, seed=3))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    be = StockBackend()
    with torch.no_grad():  # the first call comes without gradients, as the rollout's prefill makes it
        be.attention_varlen(q, k, v, cu, lens)
    got = be.attention_varlen(q, k, v, cu, lens)
    if varlen_flash() is None:
        assert be.attention_path == "sdpa_padded (this torch has no varlen_attn)"
        return
    assert be.attention_path == "varlen_flash", be.attention_path
    with torch.no_grad():
        want = StockBackend(varlen=False).attention_varlen(q, k, v, cu, lens)
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    got.float().square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_mode_a_s_run_chooses_the_varlen_kernel_though_its_first_call_has_no_gradients(monkeypatch):
    """Mode A end to end with the varlen kernel chosen as on a GPU (the probe, not an explicit varlen=True): its first
    packed call is the rollout's prefill, under no_grad; the probe's case still has a gradient, so the kernel is
    chosen, the recompute and the updates run through it, and the results say so. On session 33's first H100 run the
    probe inherited no_grad and mode A fell back to the padded path."""
    from tik_kernels.e2e.run import E2EConfig, model_for, run_mode

    calls: list = []
    monkeypatch.setattr(varlen_mod, "varlen_attn", _stand_ins(calls)["2.12"])
    monkeypatch.setattr(StockBackend, "varlen_device", staticmethod(lambda q: True))
    cfg = E2EConfig(preset="tiny", modes=("A",), steps=1, prompts=2, group=2, max_slots=4, answer_len=(2, 4),
                    ppo_epochs=2, minibatches=2)
    mc, params = model_for(cfg, "cpu")
    res = run_mode("A", cfg, mc, params, "cpu")
    assert res["stock_attention"] == "varlen_flash"
    assert res["equal_tokens"] >= 0 and res["tokens"] > 0
    # the probe's case, the rollout's prefills, the recompute and the updates' forwards all went through it
    assert len(calls) >= 1 + 1 + 1 + 2
