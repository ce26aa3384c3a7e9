"""rmsnorm: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import types

import pytest
import torch
from plant import assert_caught, assert_gpu_plan_passes, failed

import tik_kernels.ops.rmsnorm as root
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.rmsnorm import CPU_SIZES, configs, make_plan
from tik_kernels.reference.rmsnorm import rmsnorm as rmsnorm_ref


def _small_plan():
    """One CPU config (odd width H=100) with every check kind: quick to run per planted bug."""
    return make_plan(configs("cpu")[:1], CPU_SIZES, seed=3)


def _module(fn) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.rmsnorm = fn
    return mod


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("rmsnorm").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    kinds = {r.requirement for r in results}
    assert kinds == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy", "gradient",
                     "grad_mode_invariance"}


@pytest.mark.parametrize("shape", [(1, 100), (7, 3, 16), (5, 2, 2, 24)], ids=["2d", "qk_norm_3d", "4d"])
def test_any_rank_matches_hf_cast_order_bitwise(shape):
    x = torch.randn(shape).to(torch.bfloat16)
    w = torch.randn(shape[-1]).to(torch.bfloat16)
    y = root.rmsnorm(x, w, 1e-6)
    xf = x.float()
    hf = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(y.view(torch.int16), hf.view(torch.int16))


@pytest.mark.parametrize("tile", [1024, 8192], ids=["tile1024", "tile8192"])
def test_other_tunable_values_keep_the_contract(monkeypatch, tile):
    # a tuner derivation changes CONFIG only: rows per tile change, each row's reduction must not
    monkeypatch.setitem(root.CONFIG, "TILE_ELEMS", tile)
    monkeypatch.setitem(root.CONFIG, "BWD_ROWS", 32)
    results = run_plan(make_plan(configs("cpu")[2:], CPU_SIZES, seed=1), root)
    assert results and not failed(results), failed(results)


def test_non_contiguous_rows():
    base = torch.randn(6, 3 * 32).to(torch.bfloat16)
    q = base[:, :64].view(6, 2, 32)  # a slice of a fused qkv output: rows are strided
    w = torch.randn(32).to(torch.bfloat16)
    assert torch.equal(root.rmsnorm(q, w).view(torch.int16), root.rmsnorm(q.contiguous(), w).view(torch.int16))


def test_heads_of_a_stacked_projection_are_read_in_place_with_the_contiguous_bits(monkeypatch):
    """q heads sliced out of a stacked [T, (Hq + 2 Hk) * D] projection ([T, Hq, D], rows with gaps): read in place
    (two strides, no copy), forward and gradients bit-equal to a contiguous copy's; a kernel that addressed them
    with one row stride would read k's heads for some of q's rows."""
    T, Hq, Hk, D = 5, 4, 2, 16
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    w = torch.randn(D, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q = qkv[:, : Hq * D].view(T, Hq, D)
    assert root._rows(q, D)[0] is q  # no copy

    def forward_and_grad(leaf0, rows_of):
        """rmsnorm of rows_of(leaf) and the gradient of sum(y^2) with respect to those rows."""
        leaf = leaf0.detach().clone().requires_grad_()
        y = root.rmsnorm(rows_of(leaf), w, 1e-6)
        y.float().square().sum().backward()
        return y, rows_of(leaf.grad)

    got = forward_and_grad(qkv, lambda t: t[:, : Hq * D].view(T, Hq, D))
    want = forward_and_grad(q.contiguous(), lambda t: t)
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want, strict=True))
    real = root._rows
    monkeypatch.setattr(root, "_rows", lambda x, H: (x, x.shape[0] * x.shape[1], (x.stride(1), 1, 0))
                        if x.dim() == 3 and not x.is_contiguous() else real(x, H))
    assert not torch.equal(root.rmsnorm(q, w, 1e-6), want[0])


def test_weight_grad_deterministic_and_accurate_over_many_blocks():
    # 300 rows > BWD_ROWS: several partial sums reduced in a fixed order
    x = torch.randn(300, 40).to(torch.bfloat16)
    w = torch.randn(40).to(torch.bfloat16)
    g = torch.randn(300, 40).to(torch.bfloat16)
    grads = []
    for _ in range(2):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        root.rmsnorm(xx, ww).backward(g)
        grads.append((xx.grad, ww.grad))
    assert torch.equal(grads[0][1].view(torch.int16), grads[1][1].view(torch.int16))
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    rmsnorm_ref(x64, w64).backward(g.double())
    rel = (grads[0][1].double() - w64.grad).norm() / w64.grad.norm()
    assert rel < 1e-2


def _t_dependent(x, w, eps=1e-6):
    y = root.rmsnorm(x, w, eps)
    # a "reduction" whose result drifts once the batch is large, as a T-bucketed tile would
    return y if x.shape[0] < 8 else (y.float() * (1 + 2**-7)).to(y.dtype)


def _mutates_input(x, w, eps=1e-6):
    y = root.rmsnorm(x, w, eps)
    with torch.no_grad():
        x.mul_(0.5)
    return y


def _wrong_eps(x, w, eps=1e-6):
    return root.rmsnorm(x, w, 10 * eps)


_calls = {"n": 0}


def _nondeterministic(x, w, eps=1e-6):
    _calls["n"] += 1
    y = root.rmsnorm(x, w, eps)
    if _calls["n"] % 2 == 0 and y.numel() > 1:
        y = y.clone()
        y.view(-1)[-1] = y.view(-1)[-1] * 1.5 + 0.5
    return y


class _BadWeightGrad(root.RMSNormFunction):
    @staticmethod
    def backward(ctx, g):
        dx, dw, _ = root.RMSNormFunction.backward(ctx, g)
        return dx, dw * 1.1, None


def _bad_weight_grad(x, w, eps=1e-6):
    return _BadWeightGrad.apply(x, w, eps)


@pytest.mark.parametrize(
    "bug,requirement",
    [
        (_t_dependent, "batch_invariance"),
        (_mutates_input, "inputs_unchanged"),
        (_wrong_eps, "accuracy"),
        (_nondeterministic, "determinism"),
        (_bad_weight_grad, "gradient"),
    ],
    ids=["t_dependent", "mutates_input", "wrong_eps", "nondeterministic", "bad_weight_grad"],
)
def test_planted_bug_is_caught(bug, requirement):
    plan = _small_plan()
    results = run_plan(plan, _module(bug))
    assert_caught(results, requirement)


class _NondeterministicWeightGrad(root.RMSNormFunction):
    calls = 0

    @staticmethod
    def backward(ctx, g):
        dx, dw, _ = root.RMSNormFunction.backward(ctx, g)
        # as an atomic-add reduction whose order varies: a last-bit wobble on alternate calls
        _NondeterministicWeightGrad.calls += 1
        if _NondeterministicWeightGrad.calls % 2 == 0:
            dw = dw.clone()
            dw.view(torch.int16)[0] += 1
        return dx, dw, None


def test_nondeterministic_weight_grad_is_caught():
    mod = _module(lambda x, w, eps=1e-6: _NondeterministicWeightGrad.apply(x, w, eps))
    plan = get_contract("rmsnorm").plan("cpu", seed=0)
    plan.probes = [p for p in plan.probes if p.grad_args]
    plan.checks = [c for c in plan.checks if c.name.endswith(("/gradient", "/grad_determinism"))]
    results = {r.name: r for r in run_plan(plan, mod)}
    assert all(r.passed for n, r in results.items() if n.endswith("/gradient")), results
    assert any(not r.passed for n, r in results.items() if n.endswith("/grad_determinism")), results


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("rmsnorm", root)
