"""The rollout's fused launches around attention, each bit for bit what the trainer's separate calls give:

- the rope that also fills the KV cache (`rope.rope_cache`, the unified backend's `rope_cache`): the same q and k as
  `rope`, and the cache rows a scatter of them would write, for decode steps (one token per slot) and packed prefills
  (many tokens per slot, slots out of order); cache entries no token names are left alone. A rope module without
  `rope_cache` (an implementation file) falls back to rope() and the scatters;
- Qwen3's q and k norms in one launch (`rmsnorm.rmsnorm_pair`, the backend's `qk_norm`) where k's heads follow q's,
  two rmsnorm() calls otherwise and whenever a gradient is needed.

On the GPU the fused launches are other compilations of the same code: their tests there compare the bits."""

from __future__ import annotations

import types

import pytest
import torch

import tik_kernels.ops.rmsnorm as N
import tik_kernels.ops.rope as R
from tik_kernels.e2e.backends import UnifiedBackend, _rope_then_scatter


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _case(T: int, slots: list[int], pos: list[int], seed: int, fused_qkv: bool = True):
    g = torch.Generator().manual_seed(seed)
    HQ, HK, D = 4, 2, 16
    qkv = torch.randn(T, (HQ + 2 * HK) * D, generator=g).to(torch.bfloat16)
    if fused_qkv:  # strided views of one projection, as the model hands them over
        q, k, v = qkv.split([HQ * D, HK * D, HK * D], dim=-1)
        q, k, v = q.view(T, HQ, D), k.view(T, HK, D), v.view(T, HK, D)
    else:
        q, k, v = (torch.randn(T, h, D, generator=g).to(torch.bfloat16) for h in (HQ, HK, HK))
    # NaN everywhere a token does not write: a write to a wrong place, or a missing one, shows
    kc = torch.full((6, HK, 12, D), float("nan"), dtype=torch.bfloat16)
    return q, k, v, torch.tensor(pos), torch.tensor(slots), kc, kc.clone()


@pytest.mark.parametrize(("slots", "pos"), [
    ([0, 1, 2, 3], [5, 0, 11, 7]),  # a decode step: slot b holds request b, each at its own position
    ([2, 2, 2, 0, 0, 5, 5], [0, 1, 2, 0, 1, 0, 1]),  # a packed prefill: 3 sequences, slots out of order
])
@pytest.mark.parametrize("fused_qkv", [True, False])
def test_rope_cache_is_rope_and_the_scatters(slots, pos, fused_qkv):
    q, k, v, p, s, kc, vc = _case(len(slots), slots, pos, seed=len(slots), fused_qkv=fused_qkv)
    kc2, vc2 = kc.clone(), vc.clone()
    qo, ko = R.rope_cache(q, k, v, p, 1e6, kc, vc, s)
    qr, kr = _rope_then_scatter(R.rope, q, k, v, p, 1e6, kc2, vc2, s)
    for got, want in ((qo, qr), (ko, kr), (kc, kc2), (vc, vc2)):
        assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(_bits(kc[s, :, p]), _bits(kr)) and torch.equal(_bits(vc[s, :, p]), _bits(v))
    written = torch.zeros(kc.shape[0], kc.shape[2], dtype=torch.bool)
    written[s, p] = True
    assert kc.transpose(1, 2)[~written].isnan().all() and vc.transpose(1, 2)[~written].isnan().all()


def test_backend_falls_back_without_rope_cache():
    be = UnifiedBackend()
    be.m = {**be.m, "rope": types.SimpleNamespace(rope=R.rope)}  # an implementation file with rope() only
    q, k, v, p, s, kc, vc = _case(3, [0, 1, 2], [4, 1, 9], seed=3)
    kc2, vc2 = kc.clone(), vc.clone()
    got = be.rope_cache(q, k, v, p, 1e6, kc, vc, s)
    want = R.rope_cache(q, k, v, p, 1e6, kc2, vc2, s)
    for a, b in zip((*got, kc, vc), (*want, kc2, vc2), strict=True):
        assert torch.equal(_bits(a), _bits(b))


def test_bad_cache_is_one_clear_error():
    q, k, v, p, s, kc, vc = _case(3, [0, 1, 2], [4, 1, 9], seed=4)
    with pytest.raises(ValueError, match="rope_cache"):
        R.rope_cache(q, k, v, p, 1e6, kc[:, :1], vc[:, :1], s)


@pytest.mark.gpu
@pytest.mark.parametrize(("T", "per_slot"), [(1, 1), (64, 1), (4096, 512)], ids=["decode1", "decode64", "prefill"])
def test_rope_cache_is_rope_and_the_scatters_on_gpu(T, per_slot):
    """qwen3 heads (16 / 8 of 128) on the GPU: the launch that also fills the cache is another compilation of the
    rotation; its q, k and cache rows are rope()'s bits."""
    g = torch.Generator(device="cuda").manual_seed(T)
    HQ, HK, D = 16, 8, 128
    qkv = torch.randn(T, (HQ + 2 * HK) * D, generator=g, device="cuda").to(torch.bfloat16)
    q, k, v = qkv.split([HQ * D, HK * D, HK * D], dim=-1)
    q, k, v = q.view(T, HQ, D), k.view(T, HK, D), v.view(T, HK, D)
    slots = torch.arange(T, device="cuda") // per_slot
    pos = (torch.arange(T, device="cuda") % per_slot) + (0 if per_slot > 1 else 3000)
    kc = torch.full((int(slots.max()) + 1, HK, 4096, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    vc, kc2, vc2 = kc.clone(), kc.clone(), kc.clone()
    got = R.rope_cache(q, k, v, pos, 1e6, kc, vc, slots)
    want = _rope_then_scatter(R.rope, q, k, v, pos, 1e6, kc2, vc2, slots)
    for a, b in zip((*got, kc, vc), (*want, kc2, vc2), strict=True):
        assert torch.equal(_bits(a), _bits(b))


def _qk(T: int, seed: int, device: str = "cpu", hq: int = 4, hk: int = 2, d: int = 16):
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = (torch.randn(T, (hq + 2 * hk) * d, generator=g, device=device) * 3).to(torch.bfloat16)
    q, k = qkv[:, : hq * d].view(T, hq, d), qkv[:, hq * d : (hq + hk) * d].view(T, hk, d)
    wq, wk = ((torch.randn(d, generator=g, device=device) + 1).to(torch.bfloat16) for _ in range(2))
    return q, wq, k, wk


@pytest.mark.parametrize("T", [1, 5, 17])
def test_qk_norm_pair_is_two_rmsnorms(T):
    q, wq, k, wk = _qk(T, seed=T)
    assert N._follows(q, k)
    got, want = N.rmsnorm_pair(q, wq, k, wk, 1e-6), (N.rmsnorm(q, wq, 1e-6), N.rmsnorm(k, wk, 1e-6))
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and torch.equal(_bits(a), _bits(b))
    # k not right after q (separate tensors): two launches, the same bits
    kc = k.clone()
    assert not N._follows(q, kc)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(N.rmsnorm_pair(q, wq, kc, wk, 1e-6), want,
                                                               strict=True))


def test_backend_qk_norm_keeps_gradients():
    """With a gradient needed the backend's qk_norm is two differentiable rmsnorm() calls (the pair has no
    backward); without, the pair."""
    be = UnifiedBackend()
    q, wq, k, wk = _qk(6, seed=8)
    wq.requires_grad_()
    qn, kn = be.qk_norm(q, wq, k, wk, 1e-6)
    assert qn.requires_grad
    (qn.float().sum() + kn.float().sum()).backward()
    assert wq.grad is not None
    with torch.no_grad():
        a = be.qk_norm(q, wq, k, wk, 1e-6)
    assert all(torch.equal(_bits(x), _bits(y.detach())) for x, y in zip(a, (qn, kn), strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 64, 4096])
def test_qk_norm_pair_is_two_rmsnorms_on_gpu(T):
    q, wq, k, wk = _qk(T, seed=T, device="cuda", hq=16, hk=8, d=128)
    got, want = N.rmsnorm_pair(q, wq, k, wk, 1e-6), (N.rmsnorm(q, wq, 1e-6), N.rmsnorm(k, wk, 1e-6))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(_bits(a), _bits(b))


def _qk_rope_case(T: int, seed: int, device: str = "cpu", hq: int = 4, hk: int = 2, d: int = 16, per_slot: int = 1):
    """q, k, v as strided views of one stacked projection (as the model hands them over), norms' weights, positions,
    slots and NaN-filled caches."""
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = (torch.randn(T, (hq + 2 * hk) * d, generator=g, device=device) * 3).to(torch.bfloat16)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k, v = q.view(T, hq, d), k.view(T, hk, d), v.view(T, hk, d)
    wq, wk = ((torch.randn(d, generator=g, device=device) + 1).to(torch.bfloat16) for _ in range(2))
    slots = torch.arange(T, device=device) // per_slot
    pos = (torch.arange(T, device=device) % per_slot) + (0 if per_slot > 1 else 37) + torch.arange(T, device=device) % 3
    kc = torch.full((int(slots.max()) + 1, hk, int(pos.max()) + 5, d), float("nan"), dtype=torch.bfloat16,
                    device=device)
    return q, wq, k, wk, v, pos, slots, kc


def _check_qk_rope(case) -> None:
    q, wq, k, wk, v, pos, slots, kc = case
    vc, kc2, vc2 = kc.clone(), kc.clone(), kc.clone()
    got = N.rmsnorm_pair_rope_cache(q, wq, k, wk, 1e-6, v, pos, 1e6, kc, vc, slots)
    assert got is not None
    want = R.rope_cache(*N.rmsnorm_pair(q, wq, k, wk, 1e-6), v, pos, 1e6, kc2, vc2, slots)
    for a, b in zip((*got, kc, vc), (*want, kc2, vc2), strict=True):
        assert a.shape == b.shape and a.is_contiguous() == b.is_contiguous()
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize(("T", "per_slot"), [(1, 1), (5, 1), (9, 3)])
def test_qk_norm_rope_cache_is_the_pair_then_rope_cache(T, per_slot):
    """One launch (`rmsnorm_pair_rope_cache`): the q / k norms, the rope and the cache fill give the bits of the
    norm pair then rope_cache, cache rows no token names left as they were (NaN)."""
    _check_qk_rope(_qk_rope_case(T, seed=T, per_slot=per_slot))


@pytest.mark.parametrize(("T", "per_slot"), [(5, 1), (9, 3)])
def test_qk_norm_rope_cache_with_the_halves_from_registers(monkeypatch, T, per_slot):
    """ROPE_REGS: the rope reads the normed rows' halves from registers instead of storing and reloading them, the
    same bits; a head width that is no power of two (24: the halves are not the tile's column halves) keeps the
    reload."""
    monkeypatch.setitem(N.CONFIG, "ROPE_REGS", 1)
    _check_qk_rope(_qk_rope_case(T, seed=T, per_slot=per_slot))
    _check_qk_rope(_qk_rope_case(T, seed=T + 1, per_slot=per_slot, d=24))


def test_qk_norm_rope_cache_declines_what_it_cannot_fuse_and_the_backend_then_makes_two_calls():
    q, wq, k, wk, v, pos, slots, kc = _qk_rope_case(4, seed=2)
    vc = kc.clone()
    assert N.rmsnorm_pair_rope_cache(q, wq, k.clone(), wk, 1e-6, v, pos, 1e6, kc, vc, slots) is None  # k apart
    assert N.rmsnorm_pair_rope_cache(q, wq, k, wk, 1e-6, v, pos, 1e6, kc[:, :1], vc[:, :1], slots) is None
    assert torch.isnan(kc).all()  # nothing written
    for fused in (False, True):
        be = UnifiedBackend(fused_qk_rope=fused)
        kc1, vc1 = kc.clone(), kc.clone()
        got = be.qk_norm_rope_cache(q, wq, k.clone(), wk, 1e-6, v, pos, 1e6, kc1, vc1, slots)
        kc2, vc2 = kc.clone(), kc.clone()
        want = R.rope_cache(*N.rmsnorm_pair(q, wq, k.clone(), wk, 1e-6), v, pos, 1e6, kc2, vc2, slots)
        assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip((*got, kc1, vc1), (*want, kc2, vc2), strict=True))
    # a rope module that is not the library's: its own rope_cache, never the repeated arithmetic
    be = UnifiedBackend(fused_qk_rope=True)
    be.sources["rope"] = "/some/candidate/rope.py"
    calls = []
    be.m = {**be.m, "rope": types.SimpleNamespace(rope_cache=lambda *a: calls.append(a) or (a[0], a[1]))}
    be.qk_norm_rope_cache(q, wq, k, wk, 1e-6, v, pos, 1e6, kc.clone(), kc.clone(), slots)
    assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("regs", [0, 1], ids=["reload", "regs"])
@pytest.mark.parametrize(("T", "per_slot"), [(1, 1), (64, 1), (4096, 512)], ids=["decode1", "decode64", "prefill"])
def test_qk_norm_rope_cache_is_the_pair_then_rope_cache_on_gpu(monkeypatch, T, per_slot, regs):
    """qwen3 heads (16 / 8 of 128) on the GPU: the one launch repeats rope's arithmetic in another kernel, so only the
    GPU's compilation can show the bits agree; with the halves reloaded and from registers (ROPE_REGS)."""
    monkeypatch.setitem(N.CONFIG, "ROPE_REGS", regs)
    _check_qk_rope(_qk_rope_case(T, seed=T, device="cuda", hq=16, hk=8, d=128, per_slot=per_slot))
