"""sample_logprob (the rollout's sampler and its log-prob in one pass over the lm_head) gives sample()'s token and
logprob()'s value for it bit for bit: several seeds, token counts, temperatures, a vocabulary that ends on a partial
chunk, small tiles with many chunks; and a planted change to its log-sum-exp is caught."""

import pytest
import torch
from launch_spy import spy_launches

import tik_kernels.ops.logprob as lp_root
import tik_kernels.ops.sample as sample_root
from tik_kernels.contracts._lmhead import hidden_and_weight


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def _check(T: int, H: int, V: int, tau: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    h, w = hidden_and_weight(T, H, V, gen)
    seeds = torch.randint(0, 2**62, (T,), generator=gen)
    ids, lp = lp_root.sample_logprob(h, w, tau, seeds)
    want_ids = sample_root.sample(h, w, tau, seeds)
    assert torch.equal(ids, want_ids)
    assert torch.equal(_bits(lp), _bits(lp_root.logprob(h, w, want_ids, tau)))


@pytest.mark.parametrize("T,H,V,tau,seed", [(1, 64, 256, 1.0, 0), (5, 64, 300, 0.7, 1), (3, 32, 1000, 1.3, 2)])
def test_same_token_and_bits_as_the_two_operators(T, H, V, tau, seed):
    _check(T, H, V, tau, seed)


def test_small_tiles_many_chunks_and_token_blocks(monkeypatch):
    """The tree is the module's CONFIG: with small tiles and chunks both sides change alike (the sampler's own
    CONFIG left as it is: its token does not depend on its tiling)."""
    small = {"BLOCK_T": 16, "BLOCK_V": 16, "BLOCK_K": 16, "V_CHUNK": 48}
    monkeypatch.setattr(lp_root, "CONFIG", {**lp_root.CONFIG, **small})
    monkeypatch.setattr(sample_root, "CONFIG", {**sample_root.CONFIG, "BLOCK_K": 16})
    _check(37, 48, 200, 0.9, 3)


def test_rows_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(4)
    h, w = hidden_and_weight(6, 64, 256, gen)
    seeds = torch.randint(0, 2**62, (6,), generator=gen)
    ids, lp = lp_root.sample_logprob(h, w, 1.0, seeds)
    for t in (0, 5):
        i1, l1 = lp_root.sample_logprob(h[t : t + 1], w, 1.0, seeds[t : t + 1])
        assert i1.item() == ids[t].item() and torch.equal(_bits(l1), _bits(lp[t : t + 1]))


def test_errors_are_one_line():
    h, w = torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        lp_root.sample_logprob(h, w, 0.0, torch.zeros(2))
    with pytest.raises(ValueError, match="3 seeds for 2 tokens"):
        lp_root.sample_logprob(h, w, 1.0, torch.zeros(3))


def test_a_planted_log_sum_exp_order_is_caught(tmp_path):
    """The check has teeth: merging the chunks from the last one down changes the log-prob's bits."""
    from pathlib import Path

    from tik_kernels.contract import load_module

    text = Path(lp_root.__file__).read_text()
    loop = "for c in tl.range(0, NC, num_stages=MERGE_STAGES):"
    old = f"    {loop}\n        c_m = tl.load(m_part_ptr + c * T + o_t, mask=m_t, other=0.0)\n"
    assert text.count(old) == 2  # logprob's own combine, then sample_logprob's
    at = text.index(old, text.index("def _sample_logprob_combine_kernel"))
    planted = text[:at] + old.replace(loop, "for cc in range(0, NC):\n        c = NC - 1 - cc") \
        + text[at + len(old):]
    (tmp_path / "planted_lp.py").write_text(planted)
    m = load_module(tmp_path / "planted_lp.py", "planted_sample_logprob")
    gen = torch.Generator().manual_seed(5)
    h, w = hidden_and_weight(8, 64, 2000, gen)
    seeds = torch.randint(0, 2**62, (8,), generator=gen)
    ids, lp = m.sample_logprob(h, w, 1.0, seeds)
    assert torch.equal(ids, sample_root.sample(h, w, 1.0, seeds))  # no ties here: the race gives the same token
    assert not torch.equal(_bits(lp), _bits(lp_root.logprob(h, w, ids, 1.0)))


@pytest.mark.gpu
def test_gpu_same_token_and_bits_at_qwen3_shapes():
    """On the GPU at the Qwen3 lm_head (V = 151,936; H 1024 and 2048): decode batches of 1, 7 and 64 rows and a
    prefill of 300, two temperatures, each row the two operators' token and bits."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for H in (1024, 2048):
        w = (torch.randn(151936, H, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
        for T in (1, 7, 64, 300):
            h = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
            seeds = torch.randint(0, 2**62, (T,), device="cuda", generator=gen)
            for tau in (1.0, 0.6):
                ids, lp = lp_root.sample_logprob(h, w, tau, seeds)
                want = sample_root.sample(h, w, tau, seeds)
                assert torch.equal(ids, want), (H, T, tau)
                assert torch.equal(_bits(lp), _bits(lp_root.logprob(h, w, want, tau))), (H, T, tau)


@pytest.mark.gpu
def test_gpu_merge_stages_move_no_bits(monkeypatch):
    """MERGE_STAGES (the combines' chunk loop software-pipelined; on the GPU only: the interpreter has no pipeline)
    moves no bit of logprob, entropy, sample or sample_logprob at the Qwen3 lm_head: 297 chunks, decode and prefill
    batches, stages 1 (the plain loop), 2, 4 and 8."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    import tik_kernels.ops.entropy as entropy_root

    mods = (lp_root, sample_root, entropy_root)
    gen = torch.Generator(device="cuda").manual_seed(1)
    w = (torch.randn(151936, 1024, device="cuda", generator=gen) * 1024**-0.5).to(torch.bfloat16)

    def run(T: int) -> tuple:
        g = torch.Generator(device="cuda").manual_seed(T)
        h = torch.randn(T, 1024, device="cuda", generator=g).to(torch.bfloat16)
        seeds = torch.randint(0, 2**62, (T,), device="cuda", generator=g)
        targets = torch.randint(0, 151936, (T,), device="cuda", generator=g)
        ids, lp = lp_root.sample_logprob(h, w, 0.7, seeds)
        return (_bits(lp_root.logprob(h, w, targets, 0.7)), _bits(entropy_root.entropy(h, w, 0.7)),
                sample_root.sample(h, w, 0.7, seeds), ids, _bits(lp))

    for T in (1, 64, 300):
        got = {}
        for stages in (1, 2, 4, 8):
            for m in mods:
                monkeypatch.setitem(m.CONFIG, "MERGE_STAGES", stages)
            got[stages] = run(T)
        for stages in (2, 4, 8):
            for k, (a, b) in enumerate(zip(got[1], got[stages], strict=True)):
                assert torch.equal(a, b), (T, stages, k)


@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_chunks_per_program_only_launch_the_lm_head_kernels(monkeypatch, chunks):
    """CHUNKS (V chunks one program walks in turn, each from a fresh state into its own slot) moves no bit of
    logprob, sample or sample_logprob: 13 chunks of 16 entries (the last partial), so no CHUNKS divides them and the
    last program has chunks past the end (which must store nothing)."""
    small = {"BLOCK_T": 16, "BLOCK_V": 16, "BLOCK_K": 16, "V_CHUNK": 16}
    gen = torch.Generator().manual_seed(5)
    T, H, V = 20, 32, 200
    h, w = hidden_and_weight(T, H, V, gen)
    seeds = torch.randint(0, 2**62, (T,), generator=gen)
    targets = torch.randint(0, V, (T,), generator=gen)
    monkeypatch.setattr(lp_root, "CONFIG", {**lp_root.CONFIG, **small})
    monkeypatch.setattr(sample_root, "CONFIG", {**sample_root.CONFIG, **small})
    want = (lp_root.logprob(h, w, targets, 0.8), sample_root.sample(h, w, 0.8, seeds),
            *lp_root.sample_logprob(h, w, 0.8, seeds))
    monkeypatch.setattr(lp_root, "CONFIG", {**lp_root.CONFIG, "CHUNKS": chunks})
    monkeypatch.setattr(sample_root, "CONFIG", {**sample_root.CONFIG, "CHUNKS": chunks})
    got = (lp_root.logprob(h, w, targets, 0.8), sample_root.sample(h, w, 0.8, seeds),
           *lp_root.sample_logprob(h, w, 0.8, seeds))
    assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(got[1], want[1])
    assert torch.equal(got[2], want[2]) and torch.equal(_bits(got[3]), _bits(want[3]))
    assert torch.equal(got[2], want[1])  # and the one pass still draws the sampler's token


def _flat_case(monkeypatch, mod, chunks: int) -> tuple:
    """sample_logprob with small tiles: H = 40 (the last K step of a tile masked), 13 chunks (the last partial)."""
    small = {"BLOCK_T": 16, "BLOCK_V": 16, "BLOCK_K": 16, "V_CHUNK": 32, "CHUNKS": chunks}
    monkeypatch.setattr(mod, "CONFIG", {**mod.CONFIG, **small})
    gen = torch.Generator().manual_seed(6)
    h, w = hidden_and_weight(20, 40, 400, gen)
    seeds = torch.randint(0, 2**62, (20,), generator=gen)
    return h, w, seeds


@pytest.mark.parametrize("chunks", [1, 3])
def test_flat_walk_moves_no_bits(monkeypatch, chunks):
    """FLAT (one loop over a chunk's tiles and K steps) gives the nested walk's token and log-prob, bit for bit,
    and so logprob's value for the sampler's token."""
    h, w, seeds = _flat_case(monkeypatch, lp_root, chunks)
    monkeypatch.setitem(lp_root.CONFIG, "FLAT", 0)
    want_ids, want_lp = lp_root.sample_logprob(h, w, 0.8, seeds)
    monkeypatch.setitem(lp_root.CONFIG, "FLAT", 1)
    ids, lp = lp_root.sample_logprob(h, w, 0.8, seeds)
    assert torch.equal(ids, want_ids) and torch.equal(_bits(lp), _bits(want_lp))
    assert torch.equal(_bits(lp), _bits(lp_root.logprob(h, w, ids, 0.8)))


def test_a_flat_walk_that_keeps_its_accumulator_is_caught(tmp_path, monkeypatch):
    """The check above has teeth: a flat walk that forgets to restart its accumulator at a tile's end (planted)
    changes the log-prob."""
    from pathlib import Path

    from tik_kernels.contract import load_module

    text = Path(lp_root.__file__).read_text()
    reset = "                acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)\n"
    assert text.count(reset) == 1
    (tmp_path / "planted_flat.py").write_text(text.replace(reset, ""))
    m = load_module(tmp_path / "planted_flat.py", "planted_flat_sample_logprob")
    h, w, seeds = _flat_case(monkeypatch, m, 1)
    m.CONFIG["FLAT"] = 0
    _, want_lp = m.sample_logprob(h, w, 0.8, seeds)
    m.CONFIG["FLAT"] = 1
    _, lp = m.sample_logprob(h, w, 0.8, seeds)
    assert not torch.equal(_bits(lp), _bits(want_lp))


def _gpu_launch_choice_moves_no_bits(monkeypatch, key: str, off: int, on: int, seed: int) -> None:
    """sample_logprob at the Qwen3 lm_head (297 chunks, hidden 1024 and 2048), decode and prefill batches (T = 1, 64,
    300): with CONFIG[key] = on, the tokens and log-prob bits of CONFIG[key] = off."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    for H in (1024, 2048):
        gen = torch.Generator(device="cuda").manual_seed(H + seed)
        w = (torch.randn(151936, H, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
        for T in (1, 64, 300):
            h = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
            seeds = torch.randint(0, 2**62, (T,), device="cuda", generator=gen)
            monkeypatch.setitem(lp_root.CONFIG, key, off)
            want_ids, want_lp = lp_root.sample_logprob(h, w, 0.7, seeds)
            monkeypatch.setitem(lp_root.CONFIG, key, on)
            ids, lp = lp_root.sample_logprob(h, w, 0.7, seeds)
            assert torch.equal(ids, want_ids) and torch.equal(_bits(lp), _bits(want_lp)), (key, on, H, T)


@pytest.mark.gpu
def test_gpu_flat_walk_moves_no_bits(monkeypatch):
    """FLAT: the nested walk's tokens and log-prob bits."""
    _gpu_launch_choice_moves_no_bits(monkeypatch, "FLAT", 0, 1, 0)


def test_the_register_cap_reaches_the_launch(monkeypatch):
    """SLP_MAXNREG is Triton's maxnreg on sample_logprob's pass launch (0: no keyword, the compiler's choice); the
    interpreter takes it and gives the same bits (on a GPU: `test_gpu_register_cap_moves_no_bits`)."""
    h, w, seeds = _flat_case(monkeypatch, lp_root, 1)
    seen = spy_launches(monkeypatch, lp_root, "_sample_logprob_kernel", lambda args, kwargs: kwargs.get("maxnreg"))
    monkeypatch.setitem(lp_root.CONFIG, "SLP_MAXNREG", 0)
    want_ids, want_lp = lp_root.sample_logprob(h, w, 0.8, seeds)
    monkeypatch.setitem(lp_root.CONFIG, "SLP_MAXNREG", 128)
    ids, lp = lp_root.sample_logprob(h, w, 0.8, seeds)
    assert seen == [None, 128]
    assert torch.equal(ids, want_ids) and torch.equal(_bits(lp), _bits(want_lp))


@pytest.mark.gpu
@pytest.mark.parametrize("cap", [80, 128, 168])
def test_gpu_register_cap_moves_no_bits(monkeypatch, cap):
    """SLP_MAXNREG: the uncapped pass's tokens and log-prob bits."""
    _gpu_launch_choice_moves_no_bits(monkeypatch, "SLP_MAXNREG", 0, cap, cap)
