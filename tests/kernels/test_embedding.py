"""embedding: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import types

import pytest
import torch
from plant import assert_gpu_plan_passes, failed

import tik_kernels.ops.embedding as root
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.embedding import CPU_SIZES, configs, make_plan


def _module(fn) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.embedding = fn
    return mod


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("embedding").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    assert {r.requirement for r in results} == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy",
                                                "gradient",
                                                "grad_mode_invariance"}


@pytest.mark.parametrize("ids_shape", [(1,), (123,), (3, 5)], ids=["T1", "T123", "2d_ids"])
def test_forward_is_an_exact_gather(ids_shape):
    table = torch.randn(37, 1100).to(torch.bfloat16)  # H > BLOCK_H: two column blocks
    ids = torch.randint(0, 37, ids_shape, dtype=torch.int32)
    out = root.embedding(ids, table)
    assert out.shape == (*ids_shape, 1100)
    assert torch.equal(out.view(torch.int16), table[ids.long()].view(torch.int16))


def test_out_of_range_ids_give_zero_rows():
    table = torch.randn(5, 8).to(torch.bfloat16)
    out = root.embedding(torch.tensor([-1, 2, 5]), table)
    assert torch.equal(out[1], table[2]) and not out[0].any() and not out[2].any()


def test_table_grad_deterministic_with_heavy_repeats():
    ids = torch.randint(0, 3, (40,))
    g = torch.randn(40, 48).to(torch.bfloat16)
    grads = []
    for _ in range(2):
        table = torch.randn(4, 48).to(torch.bfloat16).requires_grad_()
        root.embedding(ids, table).backward(g)
        grads.append(table.grad)
    assert torch.equal(grads[0].view(torch.int16), grads[1].view(torch.int16))
    want = torch.zeros(4, 48, dtype=torch.float64).index_add_(0, ids, g.double())
    assert not grads[0][3].any()
    assert (grads[0].double() - want).norm() / want.norm() < 1e-2


def _t_dependent(ids, table):
    y = root.embedding(ids, table)
    return y if ids.shape[0] < 8 else (y.float() * (1 + 2**-7)).to(y.dtype)


def _mutates_ids(ids, table):
    y = root.embedding(ids, table)
    ids.zero_()
    return y


def _off_by_one(ids, table):
    return root.embedding((ids + 1) % table.shape[0], table)


class _LastWriteWins(torch.autograd.Function):
    """A scatter without accumulation: repeated ids keep only one token's gradient."""

    @staticmethod
    def forward(ctx, ids, table):
        ctx.save_for_backward(ids)
        ctx.vocab = table.shape[0]
        return root.embedding_fwd(ids, table)

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        d = torch.zeros((ctx.vocab, g.shape[-1]), dtype=g.dtype)
        d[ids] = g
        return None, d


class _NondeterministicGrad(root.EmbeddingFunction):
    calls = 0

    @staticmethod
    def backward(ctx, g):
        _, d = root.EmbeddingFunction.backward(ctx, g)
        # as an atomic-add whose order varies: a last-bit wobble on alternate calls
        _NondeterministicGrad.calls += 1
        if _NondeterministicGrad.calls % 2 == 0:
            (ids,) = ctx.saved_tensors
            d.view(torch.int16)[ids[0]] += 1
        return None, d


@pytest.mark.parametrize(
    "bug,requirement,check",
    [
        (_t_dependent, "batch_invariance", "batch_invariance"),
        (_mutates_ids, "inputs_unchanged", "inputs_unchanged"),
        (_off_by_one, "accuracy", "accuracy"),
        (_LastWriteWins.apply, "gradient", "gradient"),
        (_NondeterministicGrad.apply, "determinism", "grad_determinism"),
    ],
    ids=["t_dependent", "mutates_ids", "off_by_one", "last_write_wins", "nondeterministic_grad"],
)
def test_planted_bug_is_caught(bug, requirement, check):
    results = run_plan(make_plan(configs("cpu")[:1], CPU_SIZES, seed=13), _module(bug))
    missed = {r.name.rsplit("/", 1)[-1].split("[")[0]: r.requirement for r in results if not r.passed}
    assert missed.get(check) == requirement, failed(results)
    if requirement in ("accuracy", "gradient"):
        assert "batch_invariance" not in missed.values(), failed(results)


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("embedding", root)
