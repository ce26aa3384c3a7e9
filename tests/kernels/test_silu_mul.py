"""silu_mul: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import types

import pytest
import torch
import torch.nn.functional as F
from plant import assert_caught, assert_gpu_plan_passes, failed

import tik_kernels.ops.silu_mul as root
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.silu_mul import CPU_SIZES, configs, make_plan


def _module(fn) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.silu_mul = fn
    return mod


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("silu_mul").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    assert {r.requirement for r in results} == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy",
                                                "gradient",
                                                "grad_mode_invariance"}


@pytest.mark.parametrize("shape", [(1, 2 * 45), (3, 2, 2 * 1100)], ids=["T1", "3d_multi_block"])
def test_layout_is_gate_then_up(shape):
    x = (2 * torch.randn(shape)).to(torch.bfloat16)
    gate, up = x.float().chunk(2, dim=-1)
    want = (F.silu(gate) * up).to(torch.bfloat16)  # fp32 math, one rounding
    got = root.silu_mul(x)
    assert got.shape == want.shape
    # same fp32 formula, one rounding: at most one bf16 ulp apart (exp may differ in its last fp32 bit)
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30).all()


def test_strided_input():
    base = torch.randn(4, 3 * 64).to(torch.bfloat16)
    x = base[:, 64:]  # rows of stride 192, width 128
    assert torch.equal(root.silu_mul(x).view(torch.int16), root.silu_mul(x.contiguous()).view(torch.int16))


def _t_dependent(x):
    y = root.silu_mul(x)
    return y if x.shape[0] < 8 else (y.float() * (1 + 2**-7)).to(y.dtype)


def _mutates_input(x):
    y = root.silu_mul(x)
    with torch.no_grad():
        x[..., 0] = 0
    return y


def _swapped_halves(x):
    gate, up = x.chunk(2, dim=-1)
    return root.silu_mul(torch.cat([up, gate], dim=-1))


_calls = {"n": 0}


def _nondeterministic(x):
    _calls["n"] += 1
    y = root.silu_mul(x)
    if _calls["n"] % 2 == 0:
        y = y.clone()
        y.view(-1)[0] = y.view(-1)[0] * 1.5 + 0.5
    return y


class _GateGradWithoutSigmoidTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return root.silu_mul_fwd(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gate, up = x.float().chunk(2, dim=-1)
        s = torch.sigmoid(gate)
        return torch.cat([g.float() * up * s, g.float() * gate * s], dim=-1).to(x.dtype)


@pytest.mark.parametrize(
    "bug,requirement",
    [
        (_t_dependent, "batch_invariance"),
        (_mutates_input, "inputs_unchanged"),
        (_swapped_halves, "accuracy"),
        (_nondeterministic, "determinism"),
        (_GateGradWithoutSigmoidTerm.apply, "gradient"),
    ],
    ids=["t_dependent", "mutates_input", "swapped_halves", "nondeterministic", "wrong_gate_grad"],
)
def test_planted_bug_is_caught(bug, requirement):
    results = run_plan(make_plan(configs("cpu")[:1], CPU_SIZES, seed=7), _module(bug))
    assert_caught(results, requirement)


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("silu_mul", root)


def test_fill_spreads_few_tokens_over_more_programs_with_the_same_bits(monkeypatch):
    """FILL: 64 tokens x 3072 features get 192 programs, not CONFIG's 48; the bits are those of any other
    BLOCK_T, forward and backward (elementwise)."""
    assert root._block_t(64, 3072, torch.device("cpu")) == 1
    assert root._block_t(4096, 3072, torch.device("cpu")) == root.CONFIG["BLOCK_T"]
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)

    def run():
        xx = x.clone().requires_grad_()
        y = root.silu_mul(xx)
        y.float().square().sum().backward()
        return y, xx.grad

    with_fill = run()
    monkeypatch.setitem(root.CONFIG, "FILL", 0)
    assert root._block_t(6, 20, torch.device("cpu")) == root.CONFIG["BLOCK_T"]
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(run(), with_fill, strict=True))
