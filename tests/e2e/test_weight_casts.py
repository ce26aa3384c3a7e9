"""The trainer's bf16 weights, cast a layer at a time (`model._CastGroup`): the same bits as one `Tensor.to` per
weight, forward and backward, and the same update; grouped by layer so that a gradient produced early is converted
early."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tik_kernels.e2e.backends import StockBackend
from tik_kernels.e2e.model import PRESETS, bf16_weights, cast_groups, init_params
from tik_kernels.e2e.rollout import Completion, Request
from tik_kernels.e2e.trainer import grpo_step, make_optimizer, pack


def per_tensor(params: dict[str, torch.Tensor], grad: bool) -> dict[str, torch.Tensor]:
    """What bf16_weights did before the groups: one cast per weight."""
    with torch.set_grad_enabled(grad):
        W = {k: (v if grad else v.detach()).to(torch.bfloat16) for k, v in params.items()}
        if "lm_head" not in W:
            W["lm_head"] = params["embed"].to(torch.bfloat16) if grad else W["embed"]
    return W


def _params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (11, 8), "norm": (8,), "l0.ln1": (8,), "l0.wqkv": (24, 8), "l0.wo": (8, 8),
              "l1.ln1": (8,), "l1.wqkv": (24, 8), "l1.wo": (8, 8)}
    # values with bits below bf16's precision, and some that round to a tie
    return {k: (torch.randn(s, generator=g) * 3 + 2.0 ** -9).requires_grad_() for k, s in shapes.items()}


def _loss(W: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Every weight used, some twice, the embedding's bf16 copy both as embedding rows and as an lm_head."""
    h = W["embed"][torch.tensor([1, 4, 4, 9])].float()
    for i in range(2):
        h = h * W[f"l{i}.ln1"].float()
        h = h + (h @ W[f"l{i}.wqkv"].float().t())[:, :8] @ W[f"l{i}.wo"].float()
    h = h * W["norm"].float()
    return (h @ W["lm_head"].float().t()).square().mean() + (x * W["l0.wqkv"].float()).sum()


def test_grouped_casts_give_per_tensor_bits_forward_and_backward():
    x = torch.randn(24, 8, generator=torch.Generator().manual_seed(3))
    a, b = _params(), _params()
    Wa, Wb = bf16_weights(a, grad=True), per_tensor(b, grad=True)
    assert Wa.keys() == Wb.keys()
    for k in Wa:
        assert Wa[k].dtype == torch.bfloat16 and torch.equal(Wa[k].view(torch.int16), Wb[k].view(torch.int16)), k
    _loss(Wa, x).backward()
    _loss(Wb, x).backward()
    for k in a:
        assert a[k].grad.dtype == torch.float32
        assert torch.equal(a[k].grad.view(torch.int32), b[k].grad.view(torch.int32)), k
    # without gradients: one cast of everything, the tied lm_head the embedding's own tensor
    W = bf16_weights(a, grad=False)
    assert W["lm_head"] is W["embed"] and not W["embed"].requires_grad
    assert all(torch.equal(W[k].view(torch.int16), Wb[k].view(torch.int16)) for k in W)


def test_cast_groups_keep_each_layer_together_and_the_rest_alone():
    names = ["embed", "l0.ln1", "l0.wqkv", "l1.ln1", "l0.wo", "l12.w_down", "norm", "lm_head", "l12.ln2"]
    assert cast_groups(names) == [["embed"], ["l0.ln1", "l0.wqkv", "l0.wo"], ["l1.ln1"], ["l12.w_down", "l12.ln2"],
                                  ["norm"], ["lm_head"]]


def test_a_grpo_update_is_the_per_tensor_one(monkeypatch):
    """Through the trainer: a GRPO update on a small model moves every weight to the bits the per-tensor casts gave."""
    from tik_kernels.e2e import trainer

    mc = PRESETS["tiny"]
    g = torch.Generator().manual_seed(0)
    comps = []
    for i in range(4):
        prompt = torch.randint(0, mc.vocab, (4 + i,), generator=g).tolist()
        toks = torch.randint(0, mc.vocab, (3,), generator=g).tolist()
        comps.append(Completion(Request(prompt=prompt, max_new=len(toks), seed=i, group=i // 2), toks))
    packed = pack(comps, "cpu")
    n = packed.targets.numel()
    old = torch.randn(n, generator=g) * 0.1 - 3.0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def update(cast) -> dict[str, torch.Tensor]:
        monkeypatch.setattr(trainer, "bf16_weights", cast)
        params = {k: v.detach().clone().requires_grad_() for k, v in init_params(mc, 0).items()}
        grpo_step(mc, StockBackend(), params, make_optimizer(params, 1e-3), packed, old, adv)
        return params

    got, want = update(bf16_weights), update(per_tensor)
    for k in want:
        assert torch.equal(got[k].detach().view(torch.int32), want[k].detach().view(torch.int32)), k


def test_the_rollout_s_weight_update_is_a_fresh_cast():
    """RolloutEngine.load_weights copies updated masters into its static bf16 buffers in one multi-tensor copy:
    afterwards they hold what a fresh `rollout_weights` gives, tied or not, the MLP fused or not."""
    from tik_kernels.e2e.backends import UnifiedBackend
    from tik_kernels.e2e.rollout import RolloutEngine, rollout_weights

    tied = replace(PRESETS["tiny"], tie_embeddings=True)
    for mc, be in ((PRESETS["tiny"], UnifiedBackend()), (tied, UnifiedBackend(fused_mlp=True)), (tied, StockBackend())):
        params = init_params(mc, 2)
        eng = RolloutEngine(mc, be, max_slots=2, max_len=8)
        eng.load_weights(params)
        buffers = {k: v.data_ptr() for k, v in eng.W.items()}
        with torch.no_grad():
            for v in params.values():
                v.add_(torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) * 2.0 ** -7)
        eng.load_weights(params)
        want = rollout_weights(params)
        assert eng.W.keys() == want.keys()
        assert {k: v.data_ptr() for k, v in eng.W.items()} == buffers  # in place: the graphs read these buffers
        for k in want:
            assert torch.equal(eng.W[k].view(torch.int16), want[k].view(torch.int16)), k
        assert "lm_head" in params or eng.W["lm_head"] is eng.W["embed"]
        assert ("lm_head" in params) != mc.tie_embeddings


@pytest.mark.gpu
def test_on_the_gpu_the_multi_tensor_casts_give_per_tensor_bits():
    """CUDA's `_foreach_copy_` fast path (one kernel for a group of one source and one destination dtype) rounds as
    `Tensor.to` does, forward and backward, at a qwen3 layer's shapes."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = {"embed": (4096, 1024), "norm": (1024,), "l0.ln1": (1024,), "l0.wqkv": (4096, 1024),
              "l0.wo": (1024, 2048), "l0.q_norm": (128,), "l0.w_gate_up": (6144, 1024), "l0.w_down": (1024, 3072)}

    def fresh():
        return {k: (torch.randn(s, generator=g.manual_seed(i), device="cuda") * 3).requires_grad_()
                for i, (k, s) in enumerate(shapes.items())}

    a, b = fresh(), fresh()
    Wa, Wb = bf16_weights(a, grad=True), per_tensor(b, grad=True)
    for k in Wa:
        assert torch.equal(Wa[k].view(torch.int16), Wb[k].view(torch.int16)), k
    for W in (Wa, Wb):
        sum((W[k].float() * (i + 1) / 3).sum() * W[k].float().square().mean() for i, k in enumerate(W)).backward()
    for k in a:
        assert torch.equal(a[k].grad.view(torch.int32), b[k].grad.view(torch.int32)), k
