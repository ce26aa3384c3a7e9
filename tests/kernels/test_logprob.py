"""logprob: the contract's CPU plan passes on the root; planted bugs fail the check meant to catch them."""

import pytest
import torch
from launch_spy import spy_launches
from lmhead_cases import SMALL, LmheadRoot
from plant import assert_gpu_plan_passes, failed, failed_requirements

import tik_kernels.ops.logprob as root
from tik_kernels.contract import run_plan, same_bits
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.logprob import config, configs
from tik_kernels.reference.logprob import logprob as logprob_ref

ROOT = LmheadRoot("logprob", root, configs)


#: a narrow shape for the tiny-tile runs (the interpreter's cost grows with the number of tiles)
SMALL_CFG = config("H=80,V=100", 80, 100, 0.7)
SMALL_SIZES = (1, 5, 20)


def test_cpu_plan_passes_on_root():
    results = run_plan(get_contract("logprob").plan("cpu", seed=0), root)
    assert results and not failed(results), failed(results)
    assert {r.requirement for r in results} == {"batch_invariance", "determinism", "inputs_unchanged", "accuracy",
                                                "gradient",
                                                "grad_mode_invariance"}


def test_small_tiles_many_chunks_and_blocks(tmp_path):
    # 3 V chunks of 48 (the last one partial), 2 token blocks of 16 at T=20, 5 K steps: merge and masking paths
    mod = ROOT.planted(tmp_path, config=SMALL)
    results = run_plan(ROOT.plan(sizes=SMALL_SIZES, cfg=SMALL_CFG), mod)
    assert not failed(results), failed(results)


def test_leading_dims_and_target_out_of_range():
    h = torch.randn(2, 3, 64).to(torch.bfloat16)
    w = torch.randn(256, 64).to(torch.bfloat16)
    t = torch.randint(0, 256, (2, 3))
    out = root.logprob(h, w, t, 1.0)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert torch.equal(out.reshape(-1), root.logprob(h.reshape(6, 64), w, t.reshape(6), 1.0))
    t[0, 1] = 256
    assert root.logprob(h, w, t, 1.0)[0, 1] == float("-inf")
    with pytest.raises(ValueError):
        root.logprob(h, w, t, 0.0)


def test_weight_grad_deterministic_over_token_chunks(tmp_path):
    # 40 tokens in BWD_CHUNK_T = 16 chunks: grad_w accumulates three chunks in order
    mod = ROOT.planted(tmp_path, config=SMALL)
    h = torch.randn(40, 32).to(torch.bfloat16)
    w = (torch.randn(100, 32) * 0.5).to(torch.bfloat16)
    t = torch.randint(0, 100, (40,))
    g = torch.randn(40)
    grads = []
    for _ in range(2):
        ww = w.clone().requires_grad_()
        mod.logprob(h, ww, t, 0.9).backward(g)
        grads.append(ww.grad)
    assert torch.equal(grads[0].view(torch.int16), grads[1].view(torch.int16))
    w64 = w.double().requires_grad_()
    logprob_ref(h.double(), w64, t, 0.9).backward(g.double())
    assert (grads[0].double() - w64.grad).norm() / w64.grad.norm() < 1e-2


def _grads(mod, h, w, t, g, temperature=0.9):
    """(grad of hidden, grad of w) of mod.logprob's backward."""
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    mod.logprob(hh, ww, t, temperature).backward(g)
    return hh.grad, ww.grad


def test_backward_launch_choices_move_no_bits(tmp_path):
    """BWD_DZ_LOW (the dz scratch in the operands' dtype or fp32), BWD_GH_BLOCK_M (grad_hidden's rows a program),
    BWD_STAGES (the grad kernels' pipeline depth), BWD_GW_HFAST (grad_w's grid order) and BWD_CHUNK_T (the tokens a
    scratch holds) give the default's gradient bits: the grad kernels round dz the same way wherever it is stored, a
    grad_hidden element's sum over V is the same chain whatever the tile, and grad_w's chain over the tokens goes on
    through its fp32 buffer from chunk to chunk. 40 tokens in chunks of 16 (grad_w accumulates three), then 32 (two)
    and 48 (one)."""
    mod = ROOT.planted(tmp_path, config=SMALL)
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(40, 32, generator=gen).to(torch.bfloat16)
    w = (torch.randn(100, 32, generator=gen) * 0.5).to(torch.bfloat16)
    t = torch.randint(0, 100, (40,), generator=gen)
    g = torch.randn(40, generator=gen)
    want = _grads(mod, h, w, t, g)
    for key, value in (("BWD_DZ_LOW", 1 - mod.CONFIG["BWD_DZ_LOW"]), ("BWD_GH_BLOCK_M", 32), ("BWD_STAGES", 2),
                       ("BWD_GW_HFAST", 1), ("BWD_CHUNK_T", 32), ("BWD_CHUNK_T", 48)):
        mod.CONFIG[key] = value
        got = _grads(mod, h, w, t, g)
        assert all(same_bits(a, b) for a, b in zip(got, want, strict=True)), (key, value)


def _with_entropy(lp_mod, ent_mod, h, w, t, g, temperature):
    """(logprob_entropy's log-probs, its entropy, its gradients) beside (logprob's, entropy's, logprob's gradients)."""
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    lp, ent = lp_mod.logprob_entropy(hh, ww, t, temperature)
    assert not ent.requires_grad
    lp.backward(g)
    with torch.no_grad():
        want_ent = ent_mod.entropy(h, w, temperature)
    want_lp = lp_mod.logprob(h, w, t, temperature)
    return (lp.detach(), ent, hh.grad, ww.grad), (want_lp, want_ent, *_grads(lp_mod, h, w, t, g, temperature))


def test_logprob_entropy_is_logprob_and_entropy_bit_for_bit():
    """One pass for both (FWD_ENTROPY): the log-probs and their gradients are logprob's, bit for bit, and the entropy
    is entropy.entropy's where the two CONFIGs tile the logits alike (the roots' do): 21 tokens over a vocabulary of
    three V chunks of 512 (the last part-filled), two temperatures."""
    import tik_kernels.ops.entropy as ent_root

    assert all(ent_root.CONFIG[k] == root.CONFIG[k] for k in ("BLOCK_T", "BLOCK_V", "BLOCK_K", "V_CHUNK"))
    gen = torch.Generator().manual_seed(11)
    h = torch.randn(21, 32, generator=gen).to(torch.bfloat16)
    w = (torch.randn(1100, 32, generator=gen) * 0.7).to(torch.bfloat16)
    t = torch.randint(0, 1100, (21,), generator=gen)
    g = torch.randn(21, generator=gen)
    for temperature in (1.0, 0.7):
        got, want = _with_entropy(root, ent_root, h, w, t, g, temperature)
        for name, a, b in zip(("logprob", "entropy", "grad hidden", "grad w"), got, want, strict=True):
            assert same_bits(a, b), (name, temperature)


def test_the_trainer_logs_the_entropy_from_one_lm_head_pass_where_fwd_entropy_is_on(monkeypatch):
    """sequence_logprobs with the logged entropy: the unified backend's logprob_entropy, one logprob-module launch of
    the forward kernel with FWD_ENTROPY, the two operators' launches without; the same bits either way."""
    import tik_kernels.ops.entropy as ent_root
    from tik_kernels.e2e.backends import make_backend
    from tik_kernels.e2e.model import PRESETS, init_params
    from tik_kernels.e2e.trainer import Packed, sequence_logprobs

    mc = PRESETS["tiny"]
    params = init_params(mc, 0, "cpu")
    packed = Packed(torch.tensor([3, 5, 7, 9, 11, 2, 4]), torch.tensor([0, 4, 7], dtype=torch.int32),
                    torch.tensor([1, 2, 5]), torch.tensor([9, 11, 4]), torch.tensor([0, 0, 1]), [4, 3])
    be = make_backend("unified")
    runs = {}
    for on in (0, 1):
        monkeypatch.setitem(root.CONFIG, "FWD_ENTROPY", on)
        fwd = spy_launches(monkeypatch, root, "_logprob_fwd_kernel", lambda args, kwargs: kwargs["WITH_ENT"])
        ent = spy_launches(monkeypatch, ent_root, "_entropy_fwd_kernel", lambda args, kwargs: True)
        lp, e = sequence_logprobs(mc, be, {k: v.detach().requires_grad_(True) for k, v in params.items()}, packed,
                                  1.0, grad=True, with_entropy=True, entropy_grad=False)
        runs[on] = (lp.detach(), e)
        assert (fwd, ent) == (([True], []) if on else ([False], [True]))
        monkeypatch.undo()
    assert same_bits(runs[0][0], runs[1][0]) and same_bits(runs[0][1], runs[1][1])


def test_the_entropy_launch_alone_takes_the_register_cap(monkeypatch):
    """FWD_ENT_MAXNREG reaches the forward's launch with the entropy beside, and only that launch (register
    allocation moves no bits: the cap keeps two programs an SM where the entropy's state would leave one)."""
    seen = spy_launches(monkeypatch, root, "_logprob_fwd_kernel",
                        lambda args, kwargs: (kwargs["WITH_ENT"], kwargs.get("maxnreg")))
    h, w = torch.randn(5, 32).to(torch.bfloat16), torch.randn(100, 32).to(torch.bfloat16)
    t = torch.randint(0, 100, (5,))
    root.logprob(h, w, t)
    root.logprob_entropy(h, w, t)
    assert seen == [(False, None), (True, root.CONFIG["FWD_ENT_MAXNREG"] or None)]


def test_a_low_dz_scratch_is_the_operands_dtype(tmp_path, monkeypatch):
    """BWD_DZ_LOW allocates the scratch in w's dtype when hidden shares it, fp32 otherwise (each grad kernel rounds dz
    to its own other operand's dtype, so one scratch cannot serve two)."""
    mod = ROOT.planted(tmp_path, config=dict(SMALL, BWD_DZ_LOW=1))
    seen = spy_launches(monkeypatch, mod, "_grad_hidden_kernel", lambda args, kwargs: args[0].dtype)  # dz
    t, g = torch.randint(0, 100, (20,)), torch.randn(20)
    _grads(mod, torch.randn(20, 32).to(torch.bfloat16), torch.randn(100, 32).to(torch.bfloat16), t, g)
    _grads(mod, torch.randn(20, 32), torch.randn(100, 32).to(torch.bfloat16), t, g)
    assert seen == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]


def test_planted_t_dependent_chunking_fails_batch_invariance(tmp_path):
    # the K step of the logits dot chosen by the batch size (a "T-bucketed" tile): other bits once T >= 8
    mod = ROOT.planted(tmp_path, ('    cfg = CONFIG\n    out = torch.empty((T,)',
                              '    cfg = dict(CONFIG, BLOCK_K=CONFIG["BLOCK_K"] if T < 8 else 32)\n'
                              '    out = torch.empty((T,)'))
    assert "batch_invariance" in failed_requirements(run_plan(ROOT.plan(), mod))


def test_planted_block_dependent_order_fails_batch_invariance(tmp_path):
    # each token block runs the dot over H starting at a different K step (a "staggered" schedule):
    # a token's logits then depend on which block it lands in, i.e. on the other tokens
    mod = ROOT.planted(tmp_path, (
        "    for k0 in range(0, H, BLOCK_K):\n",
        "    n_k = tl.cdiv(H, BLOCK_K)\n    for i in range(0, n_k):\n"
        "        k0 = ((i + tl.min(o_t) // BLOCK_T) % n_k) * BLOCK_K\n",
    ), config=SMALL)
    results = run_plan(ROOT.plan(sizes=SMALL_SIZES, cfg=SMALL_CFG), mod)
    assert "batch_invariance" in failed_requirements(results)
    assert "accuracy" not in failed_requirements(results)  # the values are right, only their bits move


def test_planted_input_mutation_fails_inputs_unchanged(tmp_path):
    # scaling the hidden states by 1/temperature in place instead of passing the temperature on
    mod = ROOT.planted(tmp_path, ("    return LogprobFunction.apply(h2, w2, t, float(temperature))",
                              "    h2.div_(temperature)\n    return LogprobFunction.apply(h2, w2, t, 1.0)"))
    assert "inputs_unchanged" in failed_requirements(run_plan(ROOT.plan(), mod))


def test_planted_wrong_temperature_fails_accuracy(tmp_path):
    mod = ROOT.planted(tmp_path, ("    return acc / temperature\n", "    return acc * temperature\n"))
    missed = failed_requirements(run_plan(ROOT.plan(), mod))
    assert missed == {"accuracy"}, missed


def test_planted_backward_without_temperature_fails_gradient(tmp_path):
    mod = ROOT.planted(tmp_path, ("b_dz = b_g[:, None] * (b_hit - b_p) / temperature",
                              "b_dz = b_g[:, None] * (b_hit - b_p)"))
    missed = failed_requirements(run_plan(ROOT.plan(grad=True), mod))
    assert missed == {"gradient"}, missed


@pytest.mark.gpu
def test_gpu_plan_passes_on_cuda():
    assert_gpu_plan_passes("logprob", root)


@pytest.mark.gpu
def test_gpu_logprob_entropy_is_logprob_and_entropy_bit_for_bit():
    """At the Qwen3 lm_head (hidden 1024 and 2048, V = 151,936), 300 and 1500 tokens: logprob_entropy's log-probs and
    gradients are logprob's and its entropy is entropy.entropy's, bit for bit."""
    import tik_kernels.ops.entropy as ent_root

    for H in (1024, 2048):
        gen = torch.Generator(device="cuda").manual_seed(H + 1)
        w = (torch.randn(151936, H, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
        for T in (300, 1500):
            h = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
            t = torch.randint(0, 151936, (T,), device="cuda", generator=gen)
            g = torch.randn(T, device="cuda", generator=gen)
            got, want = _with_entropy(root, ent_root, h, w, t, g, 0.7)
            for name, a, b in zip(("logprob", "entropy", "grad hidden", "grad w"), got, want, strict=True):
                assert same_bits(a, b), (name, H, T)


@pytest.mark.gpu
def test_gpu_backward_launch_choices_move_no_bits(monkeypatch):
    """At the Qwen3 lm_head (hidden 1024 and 2048, V = 151,936), 300 and 1500 tokens (two BWD_CHUNK_T chunks of 1024,
    one of 4096): the dz scratch in the other dtype, BWD_GH_BLOCK_M = 64, BWD_STAGES = 5, BWD_GW_HFAST and
    BWD_CHUNK_T = 4096 give the default's gradient bits."""
    for H in (1024, 2048):
        gen = torch.Generator(device="cuda").manual_seed(H)
        w = (torch.randn(151936, H, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
        for T in (300, 1500):
            h = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
            t = torch.randint(0, 151936, (T,), device="cuda", generator=gen)
            g = torch.randn(T, device="cuda", generator=gen)
            want = _grads(root, h, w, t, g, 0.7)
            for key, value in (("BWD_DZ_LOW", 1 - root.CONFIG["BWD_DZ_LOW"]), ("BWD_GH_BLOCK_M", 64),
                               ("BWD_STAGES", 5), ("BWD_GW_HFAST", 1 - root.CONFIG["BWD_GW_HFAST"]),
                               ("BWD_CHUNK_T", 4096 if root.CONFIG["BWD_CHUNK_T"] != 4096 else 1024)):
                monkeypatch.setitem(root.CONFIG, key, value)
                got = _grads(root, h, w, t, g, 0.7)
                monkeypatch.undo()
                assert all(same_bits(a, b) for a, b in zip(got, want, strict=True)), (key, H, T)
