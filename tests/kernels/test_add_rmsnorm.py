"""add_rmsnorm: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import types

import pytest
import torch
from plant import assert_caught, assert_gpu_plan_passes, failed

import tik_kernels.ops.add_rmsnorm as root
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.add_rmsnorm import CPU_SIZES, configs, make_plan


def _module(fn) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.add_rmsnorm = fn
    return mod


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("add_rmsnorm").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    kinds = {r.requirement for r in results}
    assert kinds == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy", "gradient",
                     "grad_mode_invariance"}


@pytest.mark.parametrize("shape", [(1, 100), (9, 64), (2, 3, 32)], ids=["T1", "T9", "3d"])
def test_matches_bf16_add_then_hf_rmsnorm_bitwise(shape):
    x, r = torch.randn(shape).to(torch.bfloat16), torch.randn(shape).to(torch.bfloat16)
    w = torch.randn(shape[-1]).to(torch.bfloat16)
    out, res = root.add_rmsnorm(x, r, w, 1e-5)
    s = x + r
    sf = s.float()
    hf = w * (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    assert torch.equal(res.view(torch.int16), s.view(torch.int16))
    assert torch.equal(out.view(torch.int16), hf.view(torch.int16))


def test_backward_with_only_the_normed_output_used():
    x = torch.randn(5, 48).to(torch.bfloat16).requires_grad_()
    r = torch.randn(5, 48).to(torch.bfloat16).requires_grad_()
    w = torch.randn(48).to(torch.bfloat16).requires_grad_()
    out, _ = root.add_rmsnorm(x, r, w)
    out.float().sum().backward()
    x64, w64 = (x.detach() + r.detach()).double().requires_grad_(), w.detach().double().requires_grad_()
    (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64).sum().backward()
    assert torch.equal(x.grad.view(torch.int16), r.grad.view(torch.int16))
    assert (x.grad.double() - x64.grad).norm() / x64.grad.norm() < 1e-2
    assert (w.grad.double() - w64.grad).norm() / w64.grad.norm() < 1e-2


def _t_dependent(x, r, w, eps=1e-6):
    out, s = root.add_rmsnorm(x, r, w, eps)
    return (out if x.shape[0] < 8 else (out.float() * (1 + 2**-7)).to(out.dtype)), s


def _mutates_input(x, r, w, eps=1e-6):
    out, s = root.add_rmsnorm(x, r, w, eps)
    with torch.no_grad():
        r.copy_(s)  # an "in-place residual update" leaking into the caller's tensor
    return out, s


def _wrong_eps(x, r, w, eps=1e-6):
    return root.add_rmsnorm(x, r, w, 10 * eps)


def _residual_in_fp32_then_dropped(x, r, w, eps=1e-6):
    # forgets the residual: normalizes x alone
    out, _ = root.add_rmsnorm(x, torch.zeros_like(r), w, eps)
    return out, x + r


_calls = {"n": 0}


def _nondeterministic(x, r, w, eps=1e-6):
    _calls["n"] += 1
    out, s = root.add_rmsnorm(x, r, w, eps)
    if _calls["n"] % 2 == 0:
        s = s.clone()
        s.view(-1)[0] = s.view(-1)[0] * 1.5 + 0.5
    return out, s


class _ResidualGradDropped(root.AddRMSNormFunction):
    @staticmethod
    def backward(ctx, g_out, g_residual):
        return root.AddRMSNormFunction.backward(ctx, g_out, None)


@pytest.mark.parametrize(
    "bug,requirement",
    [
        (_t_dependent, "batch_invariance"),
        (_mutates_input, "inputs_unchanged"),
        (_wrong_eps, "accuracy"),
        (_residual_in_fp32_then_dropped, "accuracy"),
        (_nondeterministic, "determinism"),
        (lambda x, r, w, eps=1e-6: _ResidualGradDropped.apply(x, r, w, eps), "gradient"),
    ],
    ids=["t_dependent", "mutates_input", "wrong_eps", "drops_residual", "nondeterministic", "drops_residual_grad"],
)
def test_planted_bug_is_caught(bug, requirement):
    plan = make_plan(configs("cpu")[:1], CPU_SIZES, seed=5)
    results = run_plan(plan, _module(bug))
    assert_caught(results, requirement)


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("add_rmsnorm", root)
