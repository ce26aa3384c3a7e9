"""Mode A's stock backend with its fused compositions through torch.compile (`StockBackend(compiled=True)`): the
same values as the eager compositions, gradients included, for several batch sizes through one compilation; a
composition whose compilation fails falls back to eager for good and says so. On the CPU torch.compile runs with
the aot_eager backend (dynamo and AOTAutograd trace the same graphs; inductor's code generation is the GPU's)."""

from __future__ import annotations

import pytest
import torch

from tik_kernels.e2e.backends import StockBackend


def _inputs(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    return {"x": r(T, 64), "res": r(T, 64), "w": r(64) + 1, "gu": r(T, 2 * 48), "q": r(T, 4, 16), "k": r(T, 2, 16),
            "pos": torch.arange(T) * 3, "hidden": r(T, 32), "wv": r(100, 32), "targets": torch.arange(T) % 100}


def test_compiled_stock_matches_eager_across_batch_sizes():
    # the eager side fills the cache by its two scatters, the compiled side inside its rope (mode A's default)
    eager, fused = StockBackend(fill_in_compiled=False), StockBackend(compiled=True, compile_backend="aot_eager")
    for T, seed in ((5, 0), (9, 1), (17, 2)):  # automatic dynamic shapes: T symbolic from the second T on
        a = _inputs(T, seed)
        pairs = [
            (eager.rmsnorm(a["x"], a["w"], 1e-6), fused.rmsnorm(a["x"], a["w"], 1e-6)),
            (eager.add_rmsnorm(a["x"], a["res"], a["w"], 1e-6), fused.add_rmsnorm(a["x"], a["res"], a["w"], 1e-6)),
            (eager.silu_mul(a["gu"]), fused.silu_mul(a["gu"])),
            (eager.rope(a["q"], a["k"], a["pos"], 10000.0), fused.rope(a["q"], a["k"], a["pos"], 10000.0)),
            (eager.logprob(a["hidden"], a["wv"], a["targets"], 0.7), fused.logprob(a["hidden"], a["wv"], a["targets"],
                                                                                   0.7)),
            (eager.entropy(a["hidden"], a["wv"], 0.7), fused.entropy(a["hidden"], a["wv"], 0.7)),
        ]
        for want, got in pairs:
            for w_, g_ in zip(*(x if isinstance(x, tuple) else (x,) for x in (want, got)), strict=True):
                torch.testing.assert_close(g_.float(), w_.float(), rtol=1e-2, atol=1e-2)
        # the rope that fills the KV cache: the same q, k and cache rows (layer views of one cache, as the model
        # passes them: another offset per layer, one compilation), the fill inside the compiled rope
        caches = [torch.zeros(2, 2 * T, 2, 3 * T, 16, dtype=torch.bfloat16) for _ in range(4)]
        slots, pos = torch.arange(T).flip(0), a["pos"]
        for layer in (0, 1):
            want = eager.rope_cache(a["q"], a["k"], a["k"] * 2, pos, 1e4, caches[0][layer], caches[1][layer], slots)
            got = fused.rope_cache(a["q"], a["k"], a["k"] * 2, pos, 1e4, caches[2][layer], caches[3][layer], slots)
            for w_, g_ in zip(want, got, strict=True):
                torch.testing.assert_close(g_.float(), w_.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(caches[2].float(), caches[0].float(), rtol=1e-2, atol=1e-2)
        assert torch.equal(caches[3], caches[1]) and caches[1].any()
        torch.manual_seed(seed)
        s_eager = eager.sample(a["hidden"], a["wv"], 1.0, None)
        torch.manual_seed(seed)
        s_fused = fused.sample(a["hidden"], a["wv"], 1.0, None)
        assert torch.equal(s_eager, s_fused), "the race draws different tokens from the same noise"
    assert fused.compile_errors() == {}


def test_compiled_stock_gradients_match_eager():
    # the eager side fills the cache by its two scatters, the compiled side inside its rope (mode A's default)
    eager, fused = StockBackend(fill_in_compiled=False), StockBackend(compiled=True, compile_backend="aot_eager")
    a = _inputs(7, 3)

    def grads(be):
        x, w, q = (a[n].float().requires_grad_() for n in ("x", "w", "q"))
        y = be.rmsnorm(x, w, 1e-6).sum() + be.rope(q, q[:, :2], a["pos"], 10000.0)[0].sum()
        y = y + be.silu_mul(torch.cat([x, x], -1)).square().sum()
        return torch.autograd.grad(y, (x, w, q))

    for want, got in zip(grads(eager), grads(fused), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_failing_compilation_falls_back_to_eager(capsys):
    be = StockBackend(compiled=True, compile_backend="aot_eager")

    def broken(*args):
        raise RuntimeError("no compiler here")

    be.fused["silu_mul"].compiled = broken
    x = _inputs(4, 0)["gu"]
    torch.testing.assert_close(be.silu_mul(x), StockBackend().silu_mul(x))
    assert be.compile_errors() == {"silu_mul": "RuntimeError: no compiler here"}
    assert "silu_mul runs eagerly, torch.compile failed: RuntimeError: no compiler here" in capsys.readouterr().err
    be.silu_mul(x)  # once failed, never tried again


def test_compiled_stock_keeps_widths_static_and_compiles_each_composition_at_most_twice():
    """torch's automatic dynamic shapes (`compile_dynamic=None`): the first batch size compiled as it is, the batch
    dimension symbolic from the second on, the vocabulary width a constant in every graph (what lets inductor plan the
    row reductions of the lm_head: on an H100 mode A's lm_head took 297 us so against 365 us with every dimension
    symbolic, benchmarks/results/lmhead_decode_h100_s21.json)."""
    graphs: list[list] = []

    def counting(gm, example_inputs):  # each graph's tensor inputs' dimensions: int constants or SymInts
        graphs.append([list(n.meta["example_value"].shape) for n in gm.graph.nodes if n.op == "placeholder"
                       and isinstance(n.meta.get("example_value"), torch.Tensor)])
        return gm.forward

    be = StockBackend(compiled=True, compile_backend=counting)
    for T in (5, 9, 17, 33):
        a = _inputs(T, T)
        be.logprob(a["hidden"], a["wv"], a["targets"], 0.7)
    assert 1 <= len(graphs) <= 2, graphs
    widths = [shape[-1] for g in graphs for shape in g if len(shape) == 2]  # the [T, V] logits' V
    assert len(widths) == len(graphs) and all(type(v) is int and v == 100 for v in widths), graphs  # not a SymInt
    assert not isinstance(graphs[-1][0][0], int), graphs  # and the batch dimension symbolic in the last
    assert be.compile_errors() == {}


def test_the_decode_key_mask_is_built_once_a_step_and_gives_the_same_bits(monkeypatch):
    """Every layer of a decode step gets the step's one `lens` tensor: the stock backend builds its key mask at the
    first layer's call and reuses it, for the same outputs as a mask built at every call; a later step's `lens` (a
    new tensor, even with equal values) gets its own mask."""
    from tik_kernels.e2e import backends as B
    from tik_kernels.e2e import model as M

    cfg = M.PRESETS["tiny"]
    W = M.bf16_weights(M.init_params(cfg, 0), grad=False)
    built = []
    real = B._key_mask
    monkeypatch.setattr(B, "_key_mask", lambda lens, kv_len: built.append(kv_len) or real(lens, kv_len))

    def step(be):
        cache = M.KVCache(cfg, 3, 16, "cpu")
        g = torch.Generator().manual_seed(1)
        cache.k.normal_(generator=g)
        cache.v.normal_(generator=g)
        ids, pos = torch.tensor([5, 9, 2]), torch.tensor([3, 7, 0])
        return M.forward_decode(cfg, be, W, ids, pos, cache, kv_len=8)

    memo = StockBackend()
    once = step(memo)
    assert built == [8]  # one mask for all the layers
    step(memo)
    assert built == [8, 8]  # the next step's lens is a new tensor: its own mask
    monkeypatch.setattr(StockBackend, "_decode_mask", lambda self, lens, kv_len: real(lens, kv_len))
    every = step(StockBackend())
    assert torch.equal(once.view(torch.int16), every.view(torch.int16)) and cfg.layers > 1


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_the_row_copy_cache_fill_writes_what_the_indexed_assignment_writes(decode):
    """`StockBackend(fill_rows=True)`: rope, then each token's k and v rows copied into the flattened cache at
    indices built once a step; the same cache and outputs as `k_cache[slots, :, pos] = k`, in a decode step (slots
    0..B-1) and a packed prefill (several tokens per slot, slots in any order)."""
    from tik_kernels.e2e import model as M

    cfg = M.PRESETS["tiny"]
    W = M.bf16_weights(M.init_params(cfg, 0), grad=False)
    outs = []
    for be in (StockBackend(fill_in_compiled=False), StockBackend(fill_rows=True)):
        cache = M.KVCache(cfg, 4, 16, "cpu")
        if decode:
            h = M.forward_decode(cfg, be, W, torch.tensor([5, 9, 2]), torch.tensor([3, 7, 0]), cache, kv_len=8)
        else:
            lens = [3, 5]
            ids = torch.tensor([4, 8, 1, 7, 7, 3, 9, 2])
            h = M.forward_packed(cfg, be, W, ids, torch.tensor([0, 3, 8], dtype=torch.int32), cache, [2, 0], lens)
        outs.append((h, cache.k.clone(), cache.v.clone()))
    (h0, k0, v0), (h1, k1, v1) = outs
    assert k0.abs().sum() > 0 and torch.equal(k0, k1) and torch.equal(v0, v1) and torch.equal(h0, h1)
