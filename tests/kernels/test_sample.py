"""sample: the contract's CPU plan passes on the root; the noise is the specified hash; the draws follow
softmax; the sampler sees logprob()'s logits; planted bugs fail the check meant to catch them."""

from pathlib import Path

import pytest
import torch
from plant import assert_gpu_plan_passes, failed, failed_requirements, own_copy, planted

import tik_kernels.ops.logprob as logprob_root
import tik_kernels.ops.sample as root
from tik_kernels.contract import Plan, run_plan, tokenwise_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts._lmhead import CPU_SIZES, hidden_and_weight
from tik_kernels.contracts.sample import _accuracy_check, _distribution_check, chi2, chi2_quantile, config
from tik_kernels.reference.logprob import logits as logits_ref
from tik_kernels.reference.sample import gumbel, noise_bits, uniform
from tik_kernels.reference.sample import sample as sample_ref

#: the root with the lm_head pieces it shares (ops/_lmhead.py) as its own copy, so a planted edit can reach them
ROOT_SRC = own_copy(Path(root.__file__).read_text(), "tik_kernels.ops._lmhead")
SMALL = {"BLOCK_T": 16, "BLOCK_V": 16, "BLOCK_K": 16, "V_CHUNK": 48}


def _planted(tmp_path, *edits: tuple[str, str], config: dict | None = None):
    return planted(tmp_path, ROOT_SRC, "planted_sample", *edits, config=config)


def _plan(H: int = 64, V: int = 256, tau: float = 0.7, sizes=CPU_SIZES):
    """One shape: invariance checks and the exact-noise accuracy check."""
    cfg = config(f"H={H},V={V}", H, V, tau)
    plan = tokenwise_plan("sample", [cfg], sizes, seed=5)
    gen = torch.Generator().manual_seed(9)
    _accuracy_check(plan, cfg.name, cfg.make_inputs(max(sizes), gen))
    return plan


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("sample").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    assert {r.requirement for r in results} == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy",
                                                "distribution"}


def test_small_tiles_many_chunks_and_blocks(tmp_path):
    mod = _planted(tmp_path, config=SMALL)
    results = run_plan(_plan(H=48, V=100, sizes=(3, 20)), mod)
    assert not failed(results), failed(results)


def test_noise_is_the_specified_hash():
    # zero logits: the sample is the argmax of the noise alone, i.e. of bits >> 9 (u and g are increasing in it)
    T, V = 12, 256
    seeds = torch.tensor([0, 1, -1, 2**62, -(2**63), 2**63 - 1, 12345, 7, 8, 9, 10, 11])
    ids = root.sample(torch.ones(T, 8).to(torch.bfloat16), torch.zeros(V, 8).to(torch.bfloat16), 1.0, seeds)
    assert torch.equal(ids, (noise_bits(seeds, V) >> 9).argmax(-1))


def test_reference_noise_is_uniform_and_gumbel():
    u = uniform(torch.arange(4000), 50)
    assert 0 < float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    stat, df = chi2(counts.long(), torch.full((20,), 1 / 20, dtype=torch.float64), u.numel())
    assert stat < chi2_quantile(df)
    g = gumbel(torch.arange(4000), 50)
    assert abs(float(g.mean()) - 0.5772) < 0.02 and abs(float(g.var()) - 3.1416**2 / 6) < 0.05


def test_reference_draws_follow_softmax():
    gen = torch.Generator().manual_seed(3)
    h, w = hidden_and_weight(1, 16, 12, gen)
    n = 20000
    ids = sample_ref(h.double().repeat(n, 1), w.double(), 0.8, torch.arange(n) * 7919 + 3)
    p = logits_ref(h.double(), w.double(), 0.8).softmax(-1)[0]
    stat, df = chi2(torch.bincount(ids, minlength=12), p, n)
    assert stat < chi2_quantile(df)


def test_greedy_ties_go_to_the_lowest_index(tmp_path):
    mod = _planted(tmp_path, config=SMALL)  # several tiles and chunks: ties across them too
    w = torch.randn(100, 16)
    w[[23, 40, 77]] = 5.0  # three identical rows far above the rest
    h = torch.ones(4, 16).to(torch.bfloat16)
    for m in (root, mod):
        assert m.sample(h, w.to(torch.bfloat16), 0.0, torch.arange(4)).tolist() == [23] * 4


def test_sampler_sees_the_logits_logprob_sees():
    gen = torch.Generator().manual_seed(11)
    T, H, V, tau = 4, 64, 256, 0.7
    h, w = hidden_and_weight(T, H, V, gen)
    seeds = torch.randint(0, 2**62, (T,), generator=gen)
    all_lp = logprob_root.logprob(h.repeat_interleave(V, 0), w, torch.arange(V).repeat(T), tau).view(T, V)
    # greedy: the chosen token has the largest logprob() of its row, bit for bit
    ids = root.sample(h, w, 0.0, seeds)
    assert torch.equal(all_lp[torch.arange(T), ids], all_lp.max(-1).values)
    # Gumbel: the chosen token maximizes logprob() + the specified noise (up to fp32 rounding of z - lse)
    ids = root.sample(h, w, tau, seeds)
    s = all_lp.double() + gumbel(seeds, V)
    assert (s[torch.arange(T), ids] >= s.max(-1).values - 1e-5).all()


def test_planted_position_keyed_noise_fails_batch_invariance(tmp_path):
    # noise keyed by the token's slot in the batch instead of its seed
    mod = _planted(tmp_path, ("b_seed = tl.load(seed_ptr + o_t, mask=m_t, other=0)", "b_seed = o_t"))
    missed = failed_requirements(run_plan(_plan(), mod))
    assert {"batch_invariance", "accuracy"} <= missed, missed


def test_planted_wrong_temperature_fails_accuracy(tmp_path):
    mod = _planted(tmp_path, ("    return acc / temperature\n", "    return acc * temperature\n"))
    missed = failed_requirements(run_plan(_plan(), mod))
    assert missed == {"accuracy"}, missed


def test_planted_negated_gumbel_fails_distribution(tmp_path):
    # +log(-log u) is a reflected Gumbel: a draw, but from the wrong distribution
    mod = _planted(tmp_path, ("b_z = b_z - tl.log(-tl.log(b_u))", "b_z = b_z + tl.log(-tl.log(b_u))"))
    plan = Plan()
    gen = torch.Generator().manual_seed(9)
    _distribution_check(plan, "H=64,V=256", 64, 256, 0.7, (1, 1000), gen)
    assert failed_requirements(run_plan(plan, mod)) == {"distribution"}  # the root passes it in the cpu plan


def test_planted_seed_mutation_fails_inputs_unchanged(tmp_path):
    # "advancing" the caller's seeds in place after drawing
    call = "sample_fwd(h2.detach(), _rows(w.detach()), float(temperature), s).reshape(lead)"
    mod = _planted(tmp_path, (f"    return {call}", f"    out = {call}\n    seeds.add_(1)\n    return out"))
    assert "inputs_unchanged" in failed_requirements(run_plan(_plan(sizes=(1, 12)), mod))


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("sample", root)


def _tied(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [20, 32], w [150, 32] and seeds, with one weight row repeated across chunks and tiles (rows 17, 49, 120
    are row 90 x 3): exact ties in the logits, likely the maximum."""
    gen = torch.Generator().manual_seed(seed)
    T, H, V = 20, 32, 150
    hidden = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    w = torch.randn(V, H, generator=gen).to(torch.bfloat16)
    w[[17, 49, 120]] = w[[90, 90, 90]] * 3
    return hidden, w, torch.arange(T, dtype=torch.int64) * 31 + 7


@pytest.mark.parametrize("launch", [{"V_CHUNK": 16, "BLOCK_V": 16}, {"V_CHUNK": 32, "BLOCK_V": 32},
                                    {"V_CHUNK": 160, "BLOCK_V": 32}, {"V_CHUNK": 64, "BLOCK_V": 16, "BLOCK_T": 32}])
def test_chunks_and_tiles_only_launch_the_race(tmp_path, launch):
    """The token is an argmax with ties to the lowest index, which no merge order changes: V_CHUNK and BLOCK_V are the
    sampler's parallelization (benchmarks/bench_lmhead_decode.py times them), not its bits. Ties planted: duplicated
    weight rows make equal logits, and greedy draws must take the lowest of them in every launch."""
    hidden, w, seeds = _tied(3)
    mod = _planted(tmp_path, config={**SMALL, **launch})
    for tau in (0.0, 0.7, 1.3):
        want = root.sample(hidden, w, tau, seeds)
        got = mod.sample(hidden, w, tau, seeds)
        assert torch.equal(got, want), (tau, launch)
    greedy = root.sample(hidden, w, 0.0, seeds)
    assert (greedy == 17).any()  # the planted tie decided some rows, towards the lowest index


@pytest.mark.parametrize("waves,sms", [(1, 3), (2, 3), (3, 7), (1, 132)])
def test_chunks_sized_for_whole_waves_draw_the_same_tokens(tmp_path, monkeypatch, waves, sms):
    """V_WAVES sizes the chunks from the SM count (whole BLOCK_V tiles, programs within `waves` waves) instead of
    V_CHUNK: a launch choice, the same tokens, ties planted as above."""
    from tik_kernels import _runtime

    monkeypatch.setattr(_runtime, "DEFAULT_SMS", sms)  # the CPU's stand-in SM count
    hidden, w, seeds = _tied(4)
    (T, _), V = hidden.shape, w.shape[0]
    mod = _planted(tmp_path, config={**SMALL, "V_WAVES": waves})
    blocks = -(-T // SMALL["BLOCK_T"])
    chunk = mod._v_chunk(V, T, torch.device("cpu"))
    assert chunk % SMALL["BLOCK_V"] == 0 and blocks * -(-V // chunk) <= max(blocks, waves * sms)
    for tau in (0.0, 0.7):
        assert torch.equal(mod.sample(hidden, w, tau, seeds), root.sample(hidden, w, tau, seeds)), (tau, chunk)
