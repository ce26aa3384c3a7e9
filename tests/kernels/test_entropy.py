"""entropy: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import pytest
import torch
from lmhead_cases import SMALL, LmheadRoot
from plant import assert_gpu_plan_passes, failed, failed_requirements

import tik_kernels.ops.entropy as root
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.entropy import config, configs
from tik_kernels.reference.logprob import entropy as entropy_ref

ROOT = LmheadRoot("entropy", root, configs)


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("entropy").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    assert {r.requirement for r in results} == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy",
                                                "gradient",
                                                "grad_mode_invariance"}


def test_small_tiles_many_chunks_and_blocks(tmp_path):
    # 3 V chunks of 48 (the last partial), 2 token blocks, 3 K steps; gradients over 2 token chunks of 16
    mod = ROOT.planted(tmp_path, config=SMALL)
    results = run_plan(ROOT.plan(grad=True, sizes=(3, 20), cfg=config("H=48,V=100", 48, 100, 0.7)), mod)
    assert not failed(results), failed(results)


@pytest.mark.parametrize("kind", ["uniform", "one_hot"])
def test_extreme_distributions(kind):
    # all logits equal: entropy = log V exactly; one logit far above the rest: entropy ≈ 0, never negative or NaN
    V, H = 200, 16
    h = torch.ones(3, H).to(torch.bfloat16)
    w = torch.zeros(V, H)
    if kind == "one_hot":
        w[17] = 8.0
    out = root.entropy(h, w.to(torch.bfloat16), 1.0)
    ref = entropy_ref(h.double(), w.double(), 1.0)
    assert torch.isfinite(out).all() and (out >= 0).all()
    assert (out.double() - ref).abs().max() < 1e-5


def test_planted_t_dependent_tile_fails_batch_invariance(tmp_path):
    mod = ROOT.planted(tmp_path, ('    cfg = CONFIG\n    out = torch.empty((T,)',
                              '    cfg = dict(CONFIG, BLOCK_K=CONFIG["BLOCK_K"] if T < 8 else 32)\n'
                              '    out = torch.empty((T,)'))
    assert "batch_invariance" in failed_requirements(run_plan(ROOT.plan(), mod))


def test_planted_wrong_temperature_fails_accuracy(tmp_path):
    mod = ROOT.planted(tmp_path, ("    return acc / temperature\n", "    return acc * temperature\n"))
    assert failed_requirements(run_plan(ROOT.plan(), mod)) == {"accuracy"}


def test_planted_backward_missing_entropy_term_fails_gradient(tmp_path):
    # dH/dz = -p (log p + H): dropping the +H term is a classic slip
    mod = ROOT.planted(tmp_path, ("(b_logp + b_ent[:, None])", "b_logp"))
    assert failed_requirements(run_plan(ROOT.plan(grad=True), mod)) == {"gradient"}


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("entropy", root)
