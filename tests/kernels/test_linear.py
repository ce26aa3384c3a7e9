"""linear: the contract on the root (CPU profile; GPU profile with -m gpu), and planted bugs it must catch.

Each planted variant is a derivation-like file: the root's source, edited or with an entry point
appended, loaded from disk like a candidate. The fixed reduction tree (K chunks of KCHUNK, each
from a fresh accumulator, chunk sums added left to right) is checked against an fp32 emulation,
and every way of spreading the chunks over programs must give its bits.
"""

from __future__ import annotations

import ast
import functools
import time
from pathlib import Path

import pytest
import torch
from launch_spy import spy_launches
from linear_planted import (
    ALTERNATING_BLOCK_K,
    SPLIT_K_BY_T,
    forward_matches_float64,
    strided_and_batched_inputs,
    variant,
)
from linear_planted import crashed as _crashed
from linear_planted import failed as _failed

import tik_kernels.ops.linear as L
from tik_kernels.contract import run_plan, same_bits
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.linear import CONTRACT, GPU_SIZES, _cancelling, projections

ROOT_SRC = Path(L.__file__).read_text()


_variant = functools.partial(variant, ROOT_SRC)


@pytest.fixture(scope="module")
def cpu_plan():
    """The CPU plan without its K = 2088 part (the planted bugs below show up at K = 64 already)."""
    plan = CONTRACT.plan("cpu", 0)
    plan.probes = [p for p in plan.probes if not p.id.startswith("chunks[")]
    plan.checks = [c for c in plan.checks if not c.name.startswith("chunks[")]
    return plan


@pytest.fixture(scope="module")
def chunk_plan():
    """The CPU plan's K = 2088 part alone: three K chunks of NARROW_KCHUNK, T = 1 … 20 over the M16 and M64 buckets."""
    plan = CONTRACT.plan("cpu", 0)
    plan.probes = [p for p in plan.probes if p.id.startswith("chunks[")]
    plan.checks = [c for c in plan.checks if c.name.startswith("chunks[")]
    assert plan.probes and plan.checks
    return plan


def test_contract_discovered():
    c = get_contract("linear")
    assert c is CONTRACT
    assert {"BLOCK_K", "KCHUNK"} <= c.frozen_tunables
    assert {r.name for r in c.requirements} >= {"batch_invariance", "determinism", "accuracy", "gradient"}


def test_root_passes_cpu_contract():
    results = run_plan(CONTRACT.plan("cpu", 0), L)
    assert results and not _failed(results), [(r.name, r.detail) for r in _failed(results)]
    names = {r.name for r in results}
    # sizes on both sides of the M8 / M64 bucket edge, backward invariance and the cancelling inputs
    assert "cancel[N=64,K=64]/batch_invariance[T=1]" in names
    assert "w[N=48,K=64]/batch_invariance[T=9]" in names
    assert "w[N=40,K=40]/batch_invariance[dx rows]" in names
    assert "chunks[N=16,K=2088]/batch_invariance[T=17]" in names


def test_split_k_by_t_is_caught(tmp_path, cpu_plan):
    results = run_plan(cpu_plan, _variant(tmp_path, "split_k", append=SPLIT_K_BY_T))
    bad = _failed(results, "batch_invariance")
    assert any(r.name.startswith("cancel[") for r in bad), [r.name for r in bad]
    # accurate all the same: only the invariance checks can see it
    assert not _failed(results, "accuracy")


def test_t_dependent_block_k_is_caught(tmp_path, cpu_plan):
    mod = _variant(tmp_path, "t_block_k", 'BLOCK_K = block_k or CONFIG["BLOCK_K"]',
                   'BLOCK_K = block_k or (16 if M <= 4 else CONFIG["BLOCK_K"])')
    results = run_plan(cpu_plan, mod)
    bad = _failed(results, "batch_invariance")
    assert any("[T=1]" in r.name or "[T=3]" in r.name for r in bad), [r.name for r in bad]
    assert not _failed(results, "accuracy")


def test_nondeterminism_is_caught(tmp_path, cpu_plan):
    results = run_plan(cpu_plan, _variant(tmp_path, "flaky", append=ALTERNATING_BLOCK_K))
    assert any(r.name == "cancel[N=64,K=64]/determinism" for r in _failed(results, "determinism"))


def test_dropped_k_tail_fails_accuracy(tmp_path, cpu_plan):
    mod = _variant(tmp_path, "no_tail",
                   "n_steps = tl.cdiv(tl.minimum(c_hi.to(tl.int64) * KCHUNK, K) - k_lo, BLOCK_K * K_UNROLL)",
                   "n_steps = (tl.minimum(c_hi.to(tl.int64) * KCHUNK, K) - k_lo) // (BLOCK_K * K_UNROLL)")
    bad = _failed(run_plan(cpu_plan, mod), "accuracy")
    # K = 40 is a tail for any BLOCK_K; K = 64 is one too when 128 of K are loaded per iteration
    assert "w[N=40,K=40]/accuracy" in [r.name for r in bad]


def test_wrong_dw_fails_gradient(tmp_path, cpu_plan):
    mod = _variant(tmp_path, "bad_dw", "dw = _matmul(dy.t(), x.t(), out_dtype=w.dtype)",
                   "dw = _matmul(dy.t(), x.t(), out_dtype=w.dtype) * 1.02")
    bad = _failed(run_plan(cpu_plan, mod), "gradient")
    assert bad and all("dw" in r.detail for r in bad)


def test_mutated_input_is_caught(tmp_path, cpu_plan):
    append = '''
_root_linear = linear


def linear(x, w):
    y = _root_linear(x, w)
    w[0, 0] = 0.0  # planted: scribbles on the weight
    return y
'''
    results = run_plan(cpu_plan, _variant(tmp_path, "mutates", append=append))
    assert _failed(results, "inputs_unchanged")


@pytest.mark.parametrize("K", [40, 64, 112], ids=["K40-tail", "K64", "K112-tail"])
def test_k_unroll_and_tile_change_no_bits(K):
    """K_UNROLL (chunks loaded per iteration) and the output tile are free; BLOCK_K is not (interpreter)."""
    from tik_kernels.contracts.linear import _cancelling

    x, w = _cancelling(32, K)(12, torch.Generator().manual_seed(3))
    ref = L._matmul(x, w, tile=(16, 16, 4, 2, 1, 0), block_k=16)
    for tile in [(16, 16, 4, 2, 2, 0), (16, 32, 4, 3, 4, 0), (32, 16, 8, 4, 2, 0), (64, 32, 4, 2, 1, 0)]:
        y = L._matmul(x, w, tile=tile, block_k=16)
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), tile
    # the cancelling inputs make the reduction order visible: a different BLOCK_K moves bits
    other = L._matmul(x, w, tile=(16, 16, 4, 2, 1, 0), block_k=32)
    assert not torch.equal(other.view(torch.int16), ref.view(torch.int16))


def _tree_fp32(x: torch.Tensor, w: torch.Tensor, kchunk: int, block_k: int) -> torch.Tensor:
    """The documented tree in fp32 torch ops: per chunk, per BLOCK_K slice (summed k in order, as the
    interpreter's dot does) added to a fresh accumulator; chunk sums added left to right from 0."""
    xf, wf = x.float(), w.float()
    K = x.shape[1]
    total = torch.zeros(x.shape[0], w.shape[0])
    for c0 in range(0, K, kchunk):
        acc = torch.zeros_like(total)
        for k0 in range(c0, min(c0 + kchunk, K), block_k):
            s = xf[:, k0, None] * wf[None, :, k0]
            for k in range(k0 + 1, min(k0 + block_k, K)):
                s = s + xf[:, k, None] * wf[None, :, k]
            acc = s + acc
        total = total + acc
    return total


def test_every_split_gives_the_tree_s_bits():
    """K = 2 chunks + 40 (the chunks of a 24-wide output, `_kchunk`): three chunks, the last partial. One program
    per tile walking all chunks, every number of chunks per program, the fused and the separate combine, other
    tiles: one fp32 result, the emulated tree's."""
    N = 24
    kc = L._kchunk(N)  # the chunks of an output this narrow
    K = 2 * kc + 40
    x, w = _cancelling(N, K)(5, torch.Generator().manual_seed(5))
    tree = _tree_fp32(x, w, kc, L.CONFIG["BLOCK_K"])
    runs = {"walk": L._matmul(x, w, torch.float32, tile=(16, 32, 4, 2, 2, 0))}
    for per_prog in (1, 2, 3):
        for fused in (True, False):
            tile = (16, 16, 4, 3, 1 + per_prog % 2, 0)
            runs[f"{per_prog}/{fused}"] = L._matmul(x, w, torch.float32, tile=tile, chunks_per_prog=per_prog,
                                                    fused=fused)
    for name, y in runs.items():
        assert same_bits(y, tree), name
    # the order is visible in these inputs: the chunk sums added right to left are other bits
    assert not same_bits(tree, _tree_fp32(x.flip(1), w.flip(1), kc, L.CONFIG["BLOCK_K"]))
    # and the bf16 entry point is the same fp32 total, rounded once
    assert same_bits(L.linear(x, w), L._matmul(x, w, tile=(16, 16, 4, 2, 2, 0), chunks_per_prog=1, fused=False))
    # the fused combine leaves its arrival counters zero for the next launch
    assert not L._COUNTERS[x.device].any()


def test_a_k_of_one_chunk_walks_without_a_running_total(monkeypatch):
    """K within one chunk (whole, and ending inside it): the walking launch carries no running total through its loop
    (ONE_CHUNK, so a 128 x 256 tile's registers hold one accumulator, not two) and adds the chunk's sum to 0 after it,
    the tree's (0 + s_0): the emulated tree's bits, a row whose products are all -0 included; K past one chunk keeps
    the running total."""
    monkeypatch.setitem(L.CONFIG, "ONE_CHUNK", 1)
    seen = spy_launches(monkeypatch, L, "_linear_fwd_kernel", lambda args, kwargs: kwargs["ONE_CHUNK"])
    N = 24
    kc = L._kchunk(N)
    for K in (kc, kc - 40):
        x, w = _cancelling(N, K)(5, torch.Generator().manual_seed(K))
        x[0], w[3] = 0.0, -w[3].abs() - 1  # row 0 times a negative weight row: every product -0
        y = L._matmul(x, w, torch.float32, tile=(16, 32, 4, 2, 1, 0))
        assert same_bits(y, _tree_fp32(x, w, kc, L.CONFIG["BLOCK_K"])), K
        assert y[0, 3].item() == 0 and not torch.signbit(y[0, 3])
    L._matmul(x[:, :40].repeat(1, 3 * kc // 40 + 1), w[:, :40].repeat(1, 3 * kc // 40 + 1), tile=(16, 32, 4, 2, 1, 0))
    monkeypatch.setitem(L.CONFIG, "ONE_CHUNK", 0)  # the CONFIG's launch: the running total, one chunk or not
    L._matmul(x, w, tile=(16, 32, 4, 2, 1, 0))
    assert seen == [True, True, False, False]


def test_a_narrow_output_s_chunks_follow_its_width_never_the_tokens(monkeypatch):
    """NARROW_N / NARROW_KCHUNK: an output of at most NARROW_N columns reduces K in chunks of
    NARROW_KCHUNK, for every T and every split, with the same tree as KCHUNK's (fresh chunk sums added left to right);
    a wider output keeps KCHUNK's chunks; the gradients follow the same rule, deterministic, dx rows invariant."""
    monkeypatch.setitem(L.CONFIG, "NARROW_KCHUNK", 128)
    monkeypatch.setitem(L.CONFIG, "NARROW_N", 24)
    assert [L._kchunk(n) for n in (1, 24, 25, 4096)] == [128, 128, L.CONFIG["KCHUNK"], L.CONFIG["KCHUNK"]]
    N, K = 24, 3 * 128 + 40  # four narrow chunks, the last partial; one KCHUNK chunk
    x, w = _cancelling(N, K)(17, torch.Generator().manual_seed(11))
    tree = _tree_fp32(x, w, 128, L.CONFIG["BLOCK_K"])
    assert not same_bits(tree, _tree_fp32(x, w, L.CONFIG["KCHUNK"], L.CONFIG["BLOCK_K"]))  # the chunks show
    runs = {"walk": L._matmul(x, w, torch.float32, tile=(16, 32, 4, 2, 2, 0))}
    for per_prog in (1, 3):
        for fused in (True, False):
            runs[f"{per_prog}/{fused}"] = L._matmul(x, w, torch.float32, tile=(16, 16, 4, 3, 1, 0),
                                                    chunks_per_prog=per_prog, fused=fused)
    for name, y in runs.items():
        assert same_bits(y, tree), name
    full = L.linear(x, w)
    for T in (1, 2, 16):
        assert same_bits(L.linear(x[-T:], w), full[-T:]), T
    # one column more: KCHUNK's tree (K < KCHUNK: one chunk)
    w2 = torch.cat([w, w[:1]])
    assert same_bits(L._matmul(x, w2, torch.float32)[:, :N], _tree_fp32(x, w, L.CONFIG["KCHUNK"], L.CONFIG["BLOCK_K"]))

    def grads():
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        L.linear(xg, wg).backward(torch.ones(x.shape[0], N, dtype=torch.bfloat16))
        return xg.grad, wg.grad

    (dx, dw), (dx2, dw2) = grads(), grads()
    assert same_bits(dx, dx2) and same_bits(dw, dw2)


def test_rows_equal_in_a_bigger_batch():
    """K = a chunk + 40 (two chunks, a partial one): rows of T = 1 … 17 (both sides of the M16 / M64 edge) as in
    T = 24."""
    N = 16
    K = L._kchunk(N) + 40
    x, w = _cancelling(N, K)(24, torch.Generator().manual_seed(6))
    full = L.linear(x, w)
    for T in (1, 2, 5, 16, 17):
        assert same_bits(L.linear(x[-T:], w), full[-T:]), T


def test_gradients_are_deterministic_and_dx_rows_invariant():
    N, K, T = 16, 40, 1024 + 24
    x, w = _cancelling(N, K)(T, torch.Generator().manual_seed(7))
    dy = torch.randn(T, N).to(torch.bfloat16)

    def grads(x, dy):
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        L.linear(xg, wg).backward(dy)
        return xg.grad, wg.grad

    (dx, dw), (dx2, dw2) = grads(x, dy), grads(x, dy)
    # dw reduces over T = 1048 tokens: two chunks, the last partial
    assert same_bits(dx, dx2) and same_bits(dw, dw2)
    assert same_bits(grads(x[:3], dy[:3])[0], dx[:3])


def _merge(body: str) -> tuple:
    """Planted edit: replace the body of `_sum_chunks`' loop."""
    old = """    for c in range(0, n_chunks):
        # .cg: chunk sums other programs wrote during this launch, never a stale L1 line
        b_part = tl.load(ws_ptr + (c * M + o_m) * N + o_n, mask=m_ws, other=0.0, cache_modifier=".cg")
        b_total = b_total + b_part
"""
    return old, body


#: a CONFIG a search may pick: the M64 bucket (T = 17 … 64) walks its chunks in one program, M16 splits
WALK_M64 = ('"M64_SPLIT": 2,', '"M64_SPLIT": 0,')


def test_chunk_size_following_t_is_caught(tmp_path, chunk_plan):
    mod = _variant(tmp_path, "chunk_by_t", "KCHUNK = _kchunk(N)", "KCHUNK = _kchunk(N) // (2 if M <= 4 else 1)")
    results = run_plan(chunk_plan, mod)
    bad = [r.name for r in _failed(results, "batch_invariance")]
    assert any("[T=1]" in n or "[T=3]" in n for n in bad), bad
    assert not _crashed(results)


def test_merge_order_following_the_split_is_caught(tmp_path, chunk_plan):
    """The split's combine adds the chunk sums right to left; the one-program walk, left to right."""
    rev = _merge("""    for c in range(0, n_chunks):
        b_part = tl.load(ws_ptr + ((n_chunks - 1 - c) * M + o_m) * N + o_n, mask=m_ws, other=0.0)
        b_total = b_total + b_part
""")
    mod = _variant(tmp_path, "reverse_merge", edits=(rev, WALK_M64))
    results = run_plan(chunk_plan, mod)
    bad = [r.name for r in _failed(results, "batch_invariance")]
    assert any("[T=1]" in n or "[T=3]" in n for n in bad), bad
    assert not _crashed(results)
    # the root with the same CONFIG passes: the walk and the split are one tree
    assert not _failed(run_plan(chunk_plan, _variant(tmp_path, "walk_m64", edits=(WALK_M64,))))


def test_pairwise_combine_is_caught(tmp_path, chunk_plan):
    """A tree combine, the chunk sums added in pairs from the last: (s1 + s2) + s0 at the plan's three chunks;
    deterministic, accurate, and not the walk's order. (Pairs from the first, (s0 + s1) + s2, are the walk's own
    order at three chunks: until session 21 this test planted those, and passed only because Triton's interpreter
    refused the pair's mask, `m_ws & (c + 1 < n_chunks)`, which tik_kernels/_interpreter.py now lets through.)"""
    pairs = _merge("""    for j in range(0, n_chunks, 2):
        c = n_chunks - 1 - j
        b_hi = tl.load(ws_ptr + (c * M + o_m) * N + o_n, mask=m_ws, other=0.0)
        b_lo = tl.load(ws_ptr + ((c - 1) * M + o_m) * N + o_n, mask=m_ws & (c >= 1), other=0.0)
        b_total = b_total + (b_lo + b_hi)
""")
    results = run_plan(chunk_plan, _variant(tmp_path, "pairwise", edits=(pairs, WALK_M64)))
    bad = [r.name for r in _failed(results, "batch_invariance")]
    assert any("[T=1]" in n or "[T=3]" in n for n in bad), bad
    assert not _failed(results, "determinism") and not _crashed(results)


@pytest.mark.parametrize("T,N,K", [(1, 16, 16), (3, 48, 40), (13, 33, 64)], ids=["T1", "T3-K40", "T13-N33"])
def test_forward_matches_float64(T, N, K):
    forward_matches_float64(L, T, N, K)


def test_strided_and_batched_inputs():
    strided_and_batched_inputs(L)


def test_config_is_a_literal_within_tunables():
    tree = ast.parse(ROOT_SRC)
    literals = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name) and t.id in ("CONFIG", "TUNABLES")}
    assert literals["CONFIG"] == L.CONFIG and literals["TUNABLES"] == L.TUNABLES
    assert set(L.CONFIG) == set(L.TUNABLES) and len(L._tile(1)) == 6
    for key, value in L.CONFIG.items():
        assert value in L.TUNABLES[key], key
    assert [L._bucket(m) for m in (1, 16, 17, 64, 65, 256, 1024, 1025, 16384)] == [
        "M16", "M16", "M64", "M64", "M256", "M256", "M1024", "MBIG", "MBIG"]
    # every K_UNROLL tiles a chunk exactly (the kernel walks chunks with pointer increments)
    assert all(L.CONFIG["KCHUNK"] % (L.CONFIG["BLOCK_K"] * u) == 0 for u in (1, 2, 4))


def test_cells_cover_the_projections():
    shapes = {(p.name, p.N, p.K) for p in projections()}
    assert ("qkv", 6144, 4096) in shapes and ("down", 4096, 14336) in shapes and len(shapes) == 6
    cells = CONTRACT.cells("gpu")
    assert len(cells) == 6 * 8 and len({c.name for c in cells}) == len(cells)
    assert sorted({c.params["M"] for c in cells}) == [1, 4, 16, 64, 256, 1024, 4096, 16384]
    assert all(c.coeff > 0 for c in cells)
    # equal weight per cell within a factor of a few: the floor-normalized objective
    small = next(c for c in cells if c.params["M"] == 1 and c.params["N"] == 4096 and c.params["K"] == 4096)
    big = next(c for c in cells if c.params["M"] == 16384 and c.params["N"] == 28672)
    assert small.coeff / big.coeff > 100
    case = CONTRACT.bench_case(CONTRACT.cells("cpu")[0], 0, "cpu")
    y, base = L.linear(*case.args), case.baseline()
    assert y.shape == base.shape and case.flops == 2 * 48 * 64


@pytest.mark.parametrize("M,K,F", [(1, 64, 24), (5, 200, 40), (64, 96, 64), (33, 128, 136)],
                         ids=["M1", "M5-K200-tail", "M64", "M33-F136"])
def test_linear_silu_mul_is_linear_then_silu_mul(M, K, F):
    """The rollout's MLP in one launch (gate and up rows into two accumulators) gives linear then silu_mul's bits."""
    from tik_kernels.ops.silu_mul import silu_mul

    gen = torch.Generator().manual_seed(M * 1000 + K)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    w = (torch.randn(2 * F, K, generator=gen) * K**-0.5).to(torch.bfloat16)
    got = L.linear_silu_mul(x, w)
    want = silu_mul(L.linear(x, w))
    assert got is not None and got.shape == (M, F)
    assert same_bits(got, want)
    # the halves matter: the other way round give other values
    assert not torch.equal(L.linear_silu_mul(x, w.roll(F, 0)), want)
    # through pointers (no TMA on the CPU anyway) and a weight whose rows are not contiguous: the same bits
    wt = w.t().contiguous().t()
    assert same_bits(L.linear_silu_mul(x, wt), want)


def test_what_linear_silu_mul_declines():
    x = torch.randn(1, 2088).to(torch.bfloat16)
    wide = torch.randn(32, 2088).to(torch.bfloat16)
    # one row over three K chunks: the M16 launch splits them over programs, where the epilogue is not
    assert L.linear_silu_mul(x, wide) is None
    assert L.linear_silu_mul(x[:, :64], wide[:31, :64]) is None  # an odd number of rows
    with pytest.raises(ValueError):
        L.linear_silu_mul(x, wide[:, :64])


@pytest.mark.gpu
@pytest.mark.parametrize("H,F", [(1024, 3072), (2048, 6144)], ids=["qwen3-0.6b", "qwen3-1.7b"])
def test_linear_silu_mul_is_linear_then_silu_mul_on_gpu(H, F):
    """At the Qwen3 MLPs' gate_up, decode batches to a prefill's tokens: the one launch's bits are the two calls'."""
    from tik_kernels.ops.silu_mul import silu_mul

    gen = torch.Generator(device="cuda").manual_seed(F)
    w = (torch.randn(2 * F, H, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
    for M in (1, 7, 16, 64, 130, 256, 1000, 8192):
        x = torch.randn(M, H, device="cuda", generator=gen).to(torch.bfloat16)
        got = L.linear_silu_mul(x, w)
        assert got is not None, M
        assert same_bits(got, silu_mul(L.linear(x, w))), M


@pytest.mark.gpu
def test_root_passes_gpu_contract():
    t = time.time()
    plan = CONTRACT.plan("gpu", 0)
    results = run_plan(plan, L, device="cuda")
    assert results and not _failed(results), [(r.name, r.detail) for r in _failed(results)]
    assert {f"o[N=4096,K=4096]/batch_invariance[T={n}]" for n in GPU_SIZES[:-1]} <= {r.name for r in results}
    print(f"gpu plan: {len(results)} checks in {time.time() - t:.1f}s")


@pytest.mark.gpu
def test_split_k_by_t_is_caught_on_gpu(tmp_path):
    plan = CONTRACT.plan("gpu", 0)
    plan.probes = [p for p in plan.probes if p.id.startswith("o[")]
    plan.checks = [c for c in plan.checks if c.name.startswith("o[") and c.requirement == "batch_invariance"]
    results = run_plan(plan, _variant(tmp_path, "split_k_gpu", append=SPLIT_K_BY_T), device="cuda")
    assert any("[T=1]" in r.name for r in _failed(results)), [(r.name, r.detail) for r in results]


def _one_chunk_is_the_walk(M: int, N: int, device: str, tiles: list) -> None:
    """K of one chunk (ONE_CHUNK, no running total in the loop) against the same product with a second chunk of zeros
    appended to K (the running-total walk, or a split: (0 + s_0) + 0 is s_0's bits), each launch tile, fp32 and bf16."""
    kc = L._kchunk(N)
    gen = torch.Generator(device=device).manual_seed(M)
    x = torch.randn(M, kc + 64, generator=gen, device=device).to(torch.bfloat16)
    w = (torch.randn(N, kc + 64, generator=gen, device=device) / kc**0.5).to(torch.bfloat16)
    x[:, kc:], w[:, kc:] = 0.0, 0.0
    x1, w1 = x[:, :kc].contiguous(), w[:, :kc].contiguous()
    for tile in tiles:
        one = L._matmul(x1, w1, torch.float32, tile=tile)
        assert same_bits(one, L._matmul(x, w, torch.float32, tile=tile)), tile
    assert same_bits(L.linear(x1, w1), L.linear(x, w))


def test_one_chunk_is_the_walk_with_a_chunk_of_zeros(monkeypatch):
    monkeypatch.setitem(L.CONFIG, "ONE_CHUNK", 1)
    _one_chunk_is_the_walk(20, 24, "cpu", [(16, 16, 4, 2, 1, 0), (16, 32, 4, 2, 2, 0)])


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 256, 4096])
def test_one_chunk_is_the_walk_with_a_chunk_of_zeros_on_gpu(M, monkeypatch):
    """Real tiles, the big one (128 x 256, 8 warps: where the running total spilled) among them."""
    monkeypatch.setitem(L.CONFIG, "ONE_CHUNK", 1)
    _one_chunk_is_the_walk(M, 4096, "cuda", [(16, 64, 4, 4, 2, 0), (128, 128, 8, 5, 1, 0), (128, 256, 8, 4, 1, 0)])


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(4096, 4096), (4096, 12288), (6144, 4096 + 40)], ids=["o", "down", "K-tail"])
def test_every_split_gives_the_same_bits_on_gpu(N, K):
    """Real shapes: every chunks-per-program, fused or separate combine, and the one-program walk, at
    M = 1, 16, 64, equal the entry point at M = 4096, row for row (fp32 totals and bf16 outputs)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    big = L.linear(x, w)
    big32 = L._matmul(x, w, torch.float32)
    n_chunks = -(-K // L._kchunk(N))
    for M in (1, 16, 64):
        for tile in [(16, 64, 4, 4, 2, 0), (64, 128, 8, 3, 1, 0)]:
            for per_prog in sorted({1, 2, 3, n_chunks}):
                for fused in (True, False):
                    y = L._matmul(x[:M], w, torch.float32, tile=tile, chunks_per_prog=per_prog, fused=fused)
                    assert same_bits(y, big32[:M]), (M, tile, per_prog, fused)
        assert same_bits(L.linear(x[:M], w), big[:M]), M
    assert not L._COUNTERS[x.device].any()


def test_tma_and_pointers_give_the_same_bits():
    """Operands through TMA descriptors or through pointers: the same values into the same dots, forward and
    both gradients (dx and dw read transposed views, which TMA reads through their storage), K with a tail."""
    gen = torch.Generator().manual_seed(3)
    T, N = 5, 24
    K = L._kchunk(N) + 40
    x = torch.randn(T, K, generator=gen).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(torch.bfloat16)
    dy = torch.randn(T, N, generator=gen).to(torch.bfloat16)
    assert L._tma_operand(x, 16, 64) is not None and L._tma_operand(w.t(), 16, 64)[1]
    for a, b in ((x, w), (dy, w.t()), (dy.t(), x.t())):
        for tile in ((16, 16, 4, 2, 1, 0), (16, 16, 4, 2, 1, 4)):
            assert same_bits(L._matmul(a, b, tile=tile, tma=True), L._matmul(a, b, tile=tile, tma=False))
    # a row stride TMA cannot take (not 16-byte aligned) falls back to pointers
    odd = torch.randn(T, K + 1, generator=gen).to(torch.bfloat16)[:, :K]
    assert L._tma_operand(odd, 16, 64) is None
    assert same_bits(L._matmul(odd, w), L._matmul(odd.contiguous(), w))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 256, 4096])
def test_tma_and_pointers_give_the_same_bits_on_gpu(M):
    """On the H200 the tiles TMA lands in shared memory (transposed for dx and dw) feed the same wgmma
    sequence as the pointer loads: forward, dx and dw equal bit for bit at real shapes, every bucket."""
    gen = torch.Generator(device="cuda").manual_seed(M)
    N, K = 6144, 4096
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    dy = torch.randn(M, N, generator=gen, device="cuda").to(torch.bfloat16)
    for a, b in ((x, w), (dy, w.t()), (dy.t(), x.t())):
        assert L._tma_operand(a, 64, 64) is not None and L._tma_operand(b, 64, 64) is not None
        assert same_bits(L._matmul(a, b, tma=True), L._matmul(a, b, tma=False))


def _swapped_is_the_same(a, b, tiles, device, modes=((None, None), (1, True), (1, False)), tmas=(True, False)):
    """Each (a, b) product with every tile, walking and split (fused and a second kernel), TMA and pointers (or the
    `modes` (chunks per program, fused) and `tmas` given): the transposed tile's fp32 totals equal the plain tile's."""
    for tile in tiles:
        for per_prog, fused in modes:
            for tma in tmas:
                kw = dict(tile=tile, chunks_per_prog=per_prog, fused=fused, tma=tma)
                plain = L._matmul(a, b, torch.float32, swap=False, **kw)
                assert same_bits(L._matmul(a, b, torch.float32, swap=True, **kw), plain), (device, tile, kw)
    assert not L._COUNTERS[a.device].any()


def test_swapped_tiles_give_the_same_bits(monkeypatch):
    """SWAP: the tile computed as w @ x.T, the accumulator [BLOCK_N, BLOCK_M]: forward, dx and dw (transposed views),
    K of two chunks and a tail, each split, the same fp32 totals; a bucket's SWAP key reaches its launches, the
    fused gate_up launch included, and a swapped launch takes one BLOCK_K slice an iteration (interpreter)."""
    gen = torch.Generator().manual_seed(11)
    T, N = 5, 24
    K = 2 * L._kchunk(N) + 40
    x, w = _cancelling(N, K)(T, gen)
    dy = torch.randn(T, N, generator=gen).to(torch.bfloat16)
    for a, b in ((x, w), (dy, w.t()), (dy.t(), x.t())):
        _swapped_is_the_same(a, b, [(16, 16, 4, 2, 1, 0), (16, 32, 4, 2, 2, 0)], "cpu")
    seen = spy_launches(monkeypatch, L, "_linear_fwd_kernel", lambda args, kwargs: (kwargs["SWAP"], kwargs["K_UNROLL"]))
    gate_up = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    h = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    plain = (L.linear(x, w), L.linear_silu_mul(h, gate_up))
    monkeypatch.setitem(L.CONFIG, "M16_SWAP", 1)
    assert same_bits(L.linear(x, w), plain[0]) and same_bits(L.linear_silu_mul(h, gate_up), plain[1])
    # the bucket's K_UNROLL (2) for the plain launches, one dot an iteration for the swapped ones
    assert seen == [(False, 2), (False, 2), (True, 1), (True, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 64])
def test_swapped_tiles_give_the_same_bits_on_gpu(M):
    """Real shapes (qkv, K of two chunks): the swapped tile's wgmma (its rows the weight's) against the plain tile's
    register-fed mma (16 rows) or wgmma (64 rows), forward, dx and dw."""
    gen = torch.Generator(device="cuda").manual_seed(M)
    N, K = 6144, 4096
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    dy = torch.randn(M, N, generator=gen, device="cuda").to(torch.bfloat16)
    tiles = [(16, 64, 4, 4, 2, 0), (16, 128, 4, 4, 2, 0), (64, 64, 4, 6, 1, 0), (64, 128, 4, 4, 1, 0)]
    # the forward every way (its compiles serve every M: M is not specialized); the gradients' transposed views with
    # two tiles, walking and split, through TMA (each M is another K for dw: compiles again)
    _swapped_is_the_same(x, w, tiles, "cuda", tmas=(True,))
    _swapped_is_the_same(x, w, tiles[:1], "cuda", tmas=(False,))
    for a, b in ((dy, w.t()), (dy.t(), x.t())):
        _swapped_is_the_same(a, b, tiles[::2], "cuda", modes=((None, None), (1, True)), tmas=(True,))


def test_wide_outputs_take_the_big_tile(monkeypatch):
    """WIDE_WAVES: an M256 / M1024 launch over a wide output (lm_head) takes the MBIG tile; decode sizes and
    narrow outputs keep their bucket's (the tile changes no bits: the tests above)."""
    big = tuple(L.CONFIG[f"MBIG_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "K_UNROLL", "SPLIT"))
    monkeypatch.setitem(L.CONFIG, "WIDE_WAVES", 2)
    assert L._tile(256, 151936, 132) == big and L._tile(1024, 151936, 132) == big
    assert L._tile(256, 6144, 132) == L._tile(256) and L._tile(16, 151936, 132) == L._tile(16)
    monkeypatch.setitem(L.CONFIG, "WIDE_WAVES", 0)
    assert L._tile(256, 151936, 132) == L._tile(256)


def test_outputs_whose_big_tiles_make_one_wave_take_the_big_tile(monkeypatch):
    """FULL_WAVE_PCT: an M256 / M1024 launch whose MBIG tiles fill between that % of the SMs and all of them takes the
    MBIG tile (Qwen3-8B's o and down at M = 1024: 128 tiles of 128 x 256 on 132 SMs); more than one wave (qkv's
    192), too few (qwen3-0.6b's 1024-wide o: 32, M = 512: 64), decode sizes and a launch asked without N keep their
    bucket's; at 0 nothing moves. Any tile gives the same bits (the tests above)."""
    big = tuple(L.CONFIG[f"MBIG_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "K_UNROLL", "SPLIT"))
    monkeypatch.setitem(L.CONFIG, "FULL_WAVE_PCT", 75)
    assert L._launch_bucket(1024, 4096, 132) == "MBIG" and L._tile(1024, 4096, 132) == big
    assert L._launch_bucket(896, 4096, 132) == "MBIG"  # 7 x 16 = 112 tiles, 85%
    for M, N in ((1024, 6144), (1024, 1024), (512, 4096), (16, 4096), (64, 4096)):
        assert L._launch_bucket(M, N, 132) == L._bucket(M), (M, N)
    assert L._tile(1024) == L._tile(1024, None, 132)
    monkeypatch.setitem(L.CONFIG, "FULL_WAVE_PCT", 0)
    assert L._launch_bucket(1024, 4096, 132) == "M1024"


def test_outputs_that_leave_sms_idle_take_the_fill_tile(monkeypatch):
    """FILL_PCT: a launch whose bucket tile gives fewer output tiles than FILL_PCT % of the SMs takes the bucket's
    FILL tile (its tile, warps and stages; the bucket's K_UNROLL and SPLIT); one that fills them keeps its own,
    and with FILL_PCT 0 nothing moves. Any tile gives the same bits (the tests above)."""
    keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
    for k, v in zip(keys, (128, 128, 8, 5), strict=True):
        monkeypatch.setitem(L.CONFIG, f"M256_{k}", v)
    for k, v in zip(keys, (128, 64, 4, 8), strict=True):
        monkeypatch.setitem(L.CONFIG, f"M256_FILL_{k}", v)
    monkeypatch.setitem(L.CONFIG, "FILL_PCT", 50)
    monkeypatch.setitem(L.CONFIG, "NARROW_PCT", 0)  # FILL alone (NARROW_PCT: the next test)
    rest = (L.CONFIG["M256_K_UNROLL"], L.CONFIG["M256_SPLIT"])
    # 2 x 32 = 64 tiles of 128 x 128 over N = 4096: under half of 132 SMs
    assert L._tile(256, 4096, 132) == (128, 64, 4, 8) + rest
    # 2 x 48 = 96 over N = 6144: enough
    assert L._tile(256, 6144, 132) == (128, 128, 8, 5) + rest
    monkeypatch.setitem(L.CONFIG, "FILL_PCT", 0)
    assert L._tile(256, 4096, 132) == (128, 128, 8, 5) + rest
    # a bucket without a FILL tile, or no N (the bucket's own tile asked for), never moves
    monkeypatch.setitem(L.CONFIG, "FILL_PCT", 100)
    assert L._tile(1024, 128, 132) == tuple(L.CONFIG[f"M1024_{k}"] for k in keys) + (
        L.CONFIG["M1024_K_UNROLL"], L.CONFIG["M1024_SPLIT"])
    assert L._tile(256) == (128, 128, 8, 5) + rest


def test_narrow_outputs_halve_the_tile_width(monkeypatch):
    """NARROW_PCT: a launch that still gives fewer output tiles than NARROW_PCT % of the SMs halves BLOCK_N (down to
    16): qwen3-0.6b's 1024-wide o and down projections at a decode batch of 64 (an M16 launch only with M16_NARROW).
    No cell of the contract's workload moves at the CONFIG's value, so the tuner's objective is the same; the bits
    are the same whatever the tile (above, and here through the entry point)."""
    config = L.CONFIG["NARROW_PCT"]
    monkeypatch.setitem(L.CONFIG, "NARROW_PCT", 25)
    monkeypatch.setitem(L.CONFIG, "M64_BLOCK_N", 64)
    monkeypatch.setitem(L.CONFIG, "M64_FILL_BLOCK_N", 64)
    assert L._tile(64, 1024, 132)[1] == 16  # 16 tiles -> 32 -> 64 of 64 x 16: 64 >= 33
    assert L._tile(64, 2048, 132)[1] == 32
    assert L._tile(64, 4096, 132)[1] == 64  # 64 tiles: enough
    assert L._tile(64, 16, 132)[1] == 16  # never under 16
    # an M16 launch keeps its bucket's width (qwen3-0.6b's down at M <= 16: 0.94x cuBLAS at 16 x 64, 1.06-1.20x at
    # 16 x 16 on an H100) unless M16_NARROW
    monkeypatch.setitem(L.CONFIG, "M16_BLOCK_N", 64)
    monkeypatch.setitem(L.CONFIG, "M16_NARROW", 0)
    assert L._tile(4, 1024, 132)[1] == 64
    monkeypatch.setitem(L.CONFIG, "M16_NARROW", 1)
    assert L._tile(4, 1024, 132)[1] == 16
    for cell in CONTRACT.cells("gpu"):
        M, N = cell.params["M"], cell.params["N"]
        monkeypatch.setitem(L.CONFIG, "NARROW_PCT", 0)
        before = L._tile(M, N, 132)
        monkeypatch.setitem(L.CONFIG, "NARROW_PCT", config)
        assert L._tile(M, N, 132) == before, cell.name
    gen = torch.Generator().manual_seed(11)
    K = L._kchunk(48) + 40
    x = torch.randn(5, K, generator=gen).to(torch.bfloat16)
    w = (torch.randn(48, K, generator=gen) / K**0.5).to(torch.bfloat16)
    monkeypatch.setitem(L.CONFIG, "NARROW_PCT", 100)
    narrow = L.linear(x, w)
    monkeypatch.setitem(L.CONFIG, "NARROW_PCT", 0)
    assert same_bits(narrow, L.linear(x, w))


def test_a_small_batch_walks_where_narrower_tiles_fill_the_sms(monkeypatch):
    """M16_WALK_PCT: an M16 launch that would split K walks it instead (SPLIT 0) where halving BLOCK_N, not below 32,
    gives at least that % of the SMs tiles; one that cannot (qwen3-0.6b's 1024-wide o), a K of one chunk, another
    bucket (M64 has its own key) and a launch asked without K keep theirs; at 0 nothing moves. The bits are the
    split's, through the entry point and the fused silu_mul epilogue, which a walking launch can take where the split
    could not."""
    from tik_kernels.ops.silu_mul import silu_mul

    monkeypatch.setitem(L.CONFIG, "M16_BLOCK_N", 64)
    monkeypatch.setitem(L.CONFIG, "M16_SPLIT", 4)
    monkeypatch.setitem(L.CONFIG, "NARROW_PCT", 25)
    split = L._tile(16, 4096, 132, 4096)
    monkeypatch.setitem(L.CONFIG, "M16_WALK_PCT", 70)
    assert L._tile(16, 6144, 132, 4096)[1::4] == (64, 0)  # Qwen3-8B's qkv: 96 tiles of 64, 73% of 132
    assert L._tile(1, 4096, 132, 4096) == split[:1] + (32,) + split[2:5] + (0,)  # o: 64 tiles of 64, 128 of 32
    assert L._tile(4, 4096, 132, 12288)[1::4] == (32, 0)  # down
    assert L._tile(16, 1024, 132, 2048) == L._tile(16, 1024, 132)  # 0.6b's o: 32 tiles of 32, 24% of the SMs
    assert L._tile(16, 6144, 132, 1024) == L._tile(16, 6144, 132)  # one chunk: nothing to split
    assert L._tile(64, 4096, 132, 4096) == L._tile(64, 4096, 132)  # M64's key is off
    monkeypatch.setitem(L.CONFIG, "M64_WALK_PCT", 70)
    monkeypatch.setitem(L.CONFIG, "M64_SPLIT", 2)
    assert L._tile(64, 4096, 132, 4096)[1::4] == (32, 0)
    monkeypatch.setitem(L.CONFIG, "M64_WALK_PCT", 0)
    monkeypatch.setitem(L.CONFIG, "M16_WALK_PCT", 100)
    assert L._tile(16, 6144, 132, 4096)[1::4] == (32, 0)  # 96 tiles short of 132: 192 of 32
    for cell in CONTRACT.cells("gpu"):
        M, N, K = cell.params["M"], cell.params["N"], cell.params["K"]
        monkeypatch.setitem(L.CONFIG, "M16_WALK_PCT", 0)
        monkeypatch.setitem(L.CONFIG, "M64_WALK_PCT", 0)
        before = L._tile(M, N, 132, K)
        assert before == L._tile(M, N, 132), cell.name
        monkeypatch.setitem(L.CONFIG, "M16_WALK_PCT", 70)
        assert L._tile(M, N, 132, K) == before or (M <= 16 and L._tile(M, N, 132, K)[5] == 0), cell.name

    # on a 4-SM device: 2 tiles of 64 split over 4 narrow chunks, or 4 tiles of 32 walking them (4 >= 70% of 4)
    monkeypatch.setattr(L, "sm_count", lambda device: 4)
    monkeypatch.setitem(L.CONFIG, "NARROW_KCHUNK", 128)
    monkeypatch.setitem(L.CONFIG, "NARROW_N", 128)
    N, K = 128, 3 * 128 + 40
    x, w = _cancelling(N, K)(5, torch.Generator().manual_seed(21))
    seen = spy_launches(monkeypatch, L, "_linear_fwd_kernel", lambda args, kwargs: (kwargs["BLOCK_N"], kwargs["SPLIT"]))
    runs = {}
    for pct in (0, 70):
        monkeypatch.setitem(L.CONFIG, "M16_WALK_PCT", pct)
        runs[pct] = (L.linear(x, w), L.linear_silu_mul(x, w))
    assert seen == [(64, True), (32, False), (16, False)]  # the split; the walk, then its silu launch (32 / 2 wide)
    assert same_bits(runs[0][0], runs[70][0]) and runs[0][1] is None
    assert same_bits(runs[70][1], silu_mul(runs[70][0]))


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(6144, 4096), (4096, 4096), (4096, 12288), (24576, 4096)],
                         ids=["qkv", "o", "down", "gate_up"])
def test_a_small_batch_walks_with_the_rows_of_a_large_one_on_gpu(N, K, monkeypatch):
    """Qwen3-8B's projections at M = 1, 4, 16, 64 walking (M16_WALK_PCT and M64_WALK_PCT 70): the rows of the entry
    point at M = 4096, and gate_up's fused silu_mul epilogue (which the split declines) linear then silu_mul's bits."""
    from tik_kernels.ops.silu_mul import silu_mul

    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4096, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    big = L.linear(x, w)
    monkeypatch.setitem(L.CONFIG, "M16_WALK_PCT", 70)
    monkeypatch.setitem(L.CONFIG, "M64_WALK_PCT", 70)
    seen = spy_launches(monkeypatch, L, "_linear_fwd_kernel", lambda args, kwargs: kwargs["SPLIT"])
    for M in (1, 4, 16, 64):
        assert same_bits(L.linear(x[-M:], w), big[-M:]), M
        if N == 24576:
            assert same_bits(L.linear_silu_mul(x[-M:], w), silu_mul(big[-M:])), M
    assert not any(seen)


def test_fused_combine_only_up_to_fused_max_m(monkeypatch):
    """FUSED_MAX_M: a split launch combines in its last-arriving program up to that many rows, with a second
    kernel above; the bits are the same either way (the chunk sums are added in one order by both)."""
    calls = []
    real = L._linear_combine_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return real[grid]

    monkeypatch.setattr(L, "_linear_combine_kernel", Spy())
    monkeypatch.setitem(L.CONFIG, "FUSED_COMBINE", 1)
    monkeypatch.setitem(L.CONFIG, "FUSED_MAX_M", 16)
    gen = torch.Generator().manual_seed(9)
    K = 2 * L._kchunk(32)
    w = torch.randn(32, K, generator=gen).to(torch.bfloat16)
    tile = (16, 32, 4, 2, 1, 8)
    outs = []
    for M in (16, 32):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        n = len(calls)
        y = L._matmul(x, w, tile=tile)
        outs.append((len(calls) > n, same_bits(y, L._matmul(x, w, tile=tile, fused=True))))
    assert outs == [(False, True), (True, True)]
