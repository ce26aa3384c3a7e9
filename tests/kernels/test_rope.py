"""rope: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import types
from pathlib import Path

import pytest
import torch
from plant import assert_caught, assert_gpu_plan_passes, failed

import tik_kernels.ops.rope as root
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.rope import CPU_SIZES, configs, make_plan, torch_rope
from tik_kernels.reference.rope import rope as rope_ref


def _module(fn) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.rope = fn
    return mod


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("rope").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    assert {r.requirement for r in results} == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy",
                                                "gradient",
                                                "grad_mode_invariance"}


def test_depends_on_pos_only_and_pos_zero_is_identity():
    q, k = torch.randn(5, 4, 16).to(torch.bfloat16), torch.randn(5, 2, 16).to(torch.bfloat16)
    same = torch.full((5,), 1234)
    qo, ko = root.rope(q[:1].expand(5, 4, 16), k[:1].expand(5, 2, 16), same, 1e6)
    assert all(torch.equal(qo[i].view(torch.int16), qo[0].view(torch.int16)) for i in range(5))
    q0, k0 = root.rope(q, k, torch.zeros(5, dtype=torch.long), 1e6)
    assert torch.equal(q0.view(torch.int16), q.view(torch.int16))
    assert torch.equal(k0.view(torch.int16), k.view(torch.int16))


def test_strided_views_of_fused_qkv_and_agreement_with_hf():
    qkv = torch.randn(6, (4 + 2 + 2) * 16).to(torch.bfloat16)
    q, k = qkv[:, :64].view(6, 4, 16), qkv[:, 64:96].view(6, 2, 16)
    pos = torch.tensor([0, 1, 2, 3, 500, 31000])
    a = root.rope(q, k, pos, 1e6)
    b = root.rope(q.contiguous(), k.contiguous(), pos, 1e6)
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a, b, strict=True))
    # HF's eager rope rounds cos/sin and every product to bf16: within a few of its ulps of ours
    for x, y, r in zip(a, torch_rope(q, k, pos, 1e6), rope_ref(q, k, pos, 1e6), strict=True):
        assert (x.double() - r).norm() / r.norm() <= (y.double() - r).norm() / r.norm()


def _row_index_positions(q, k, pos, theta=1e6):
    return root.rope(q, k, torch.arange(q.shape[0]), theta)


def _ignores_theta(q, k, pos, theta=1e6):
    return root.rope(q, k, pos, 1e4)


def _interleaved(q, k, pos, theta=1e6):
    # GPT-J convention: rotates (x[2i], x[2i+1]) instead of (x[i], x[i + D/2])
    def perm(x):
        d = x.shape[-1]
        return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1), d

    (qp, d), (kp, _) = perm(q), perm(k)
    inv = torch.empty(d, dtype=torch.long)
    inv[torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])] = torch.arange(d)
    qo, ko = root.rope(qp, kp, pos, theta)
    return qo[..., inv], ko[..., inv]


def _mutates_input(q, k, pos, theta=1e6):
    out = root.rope(q, k, pos, theta)
    pos.zero_()
    return out


_calls = {"n": 0}


def _nondeterministic(q, k, pos, theta=1e6):
    _calls["n"] += 1
    qo, ko = root.rope(q, k, pos, theta)
    if _calls["n"] % 2 == 0:
        ko = ko.clone()
        ko.view(-1)[0] = ko.view(-1)[0] * 1.5 + 0.5
    return qo, ko


class _ForwardRotationInBackward(root.RopeFunction):
    @staticmethod
    def backward(ctx, gq, gk):
        (pos,) = ctx.saved_tensors
        dq, dk = root.rope_apply(gq, gk, pos, ctx.theta, 1)
        return dq, dk, None, None


@pytest.mark.parametrize(
    "bug,requirement",
    [
        (_row_index_positions, "batch_invariance"),
        (_ignores_theta, "accuracy"),
        (_interleaved, "accuracy"),
        (_mutates_input, "inputs_unchanged"),
        (_nondeterministic, "determinism"),
        (_ForwardRotationInBackward.apply, "gradient"),
    ],
    ids=["row_index_positions", "ignores_theta", "interleaved", "mutates_pos", "nondeterministic", "backward_sign"],
)
def test_planted_bug_is_caught(bug, requirement):
    results = run_plan(make_plan(configs("cpu")[:1], CPU_SIZES, seed=11), _module(bug))
    assert_caught(results, requirement)


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("rope", root)


def test_fill_spreads_few_tokens_over_more_programs_with_the_same_bits(monkeypatch):
    """FILL: a decode step's 64 tokens get one program each (CONFIG's 8 per program gave 8 programs); the bits
    are those of any other BLOCK_T, forward and backward (rope is elementwise per token)."""
    assert root._block_t(64, torch.device("cpu")) == 1 and root._block_t(64 * 132 * 8, torch.device("cpu")) == 8
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, 4, 16, generator=gen).to(torch.bfloat16)
    k = torch.randn(6, 2, 16, generator=gen).to(torch.bfloat16)
    pos = torch.tensor([0, 5, 9, 130, 7, 2])

    def run():
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        qo, ko = root.rope(qq, kk, pos, 10000.0)
        (qo.float().square().sum() + ko.float().sum()).backward()
        return qo, ko, qq.grad, kk.grad

    with_fill = run()
    monkeypatch.setitem(root.CONFIG, "FILL", 0)
    monkeypatch.setitem(root.CONFIG, "BLOCK_T", 4)
    assert root._block_t(6, torch.device("cpu")) == 4
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(run(), with_fill, strict=True))


def test_the_rotation_fuses_the_same_products_in_rope_and_in_its_copy():
    """LLVM picks which product of `x2 * cos + x1 * sin` it fuses into an FMA from the code around it: after a change
    around rmsnorm_pair_rope_cache's copy of the rotation it fused the other one, and the rollout's q / k differed from
    rope's on the GPU (session 26). Rope spells the multiply-adds out, once, in the helpers the one-launch q / k
    norms + rope call (`_cos_sin`, `_rotate`): rmsnorm has no copy of its own that could drift (the GPU test
    `test_qk_norm_rope_cache_is_the_pair_then_rope_cache_on_gpu` is the one that sees the bits)."""
    import tik_kernels.ops.rmsnorm as rmsnorm

    ops = Path(__file__).resolve().parents[2] / "tik_kernels" / "ops"
    spelled = ("tl.fma(b_x1, b_c, (b_x2 * b_s) * -1.0)", "tl.fma(b_x1, b_s, b_x2 * b_c)",  # the rotation
               "tl.floor(tl.fma(b_ang, 0.15915494309189535, 0.5))",  # the angle's reduction to [-pi, pi]
               "tl.fma(b_k, -0.0019353071795864769, tl.fma(b_k, -6.28125, b_ang))")
    rope_src, norm_src = (ops / "rope.py").read_text(), (ops / "rmsnorm.py").read_text()
    assert all(rope_src.count(f) == 1 for f in spelled)
    assert not any(f in norm_src for f in spelled) and "6.28125" not in norm_src and "b_x2 * b_c" not in norm_src
    assert rmsnorm._cos_sin is root._cos_sin and rmsnorm._rotate is root._rotate
    rows = norm_src[norm_src.index("def _rope_rows("):]
    assert "_cos_sin(b_pos, o_i, log2_theta, HALF, 1)" in rows and "_rotate(b_x1, b_x2, b_c, b_s)" in rows
    for src in (rope_src, norm_src):
        assert "b_x1 * b_c - b_x2 * b_s" not in src and "b_x2 * b_c + b_x1 * b_s" not in src