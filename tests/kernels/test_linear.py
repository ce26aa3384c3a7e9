"""linear: the contract on the root (CPU profile; GPU profile with -m gpu), and planted bugs it must catch.

Each planted variant is a derivation-like file: the root's source, edited or with an entry point
appended, loaded from disk like a candidate.
"""

from __future__ import annotations

import ast
import functools
import time
from pathlib import Path

import pytest
import torch
from linear_planted import (
    ALTERNATING_BLOCK_K,
    SPLIT_K_BY_T,
    forward_matches_float64,
    strided_and_batched_inputs,
    variant,
)
from linear_planted import failed as _failed

import tik_kernels.ops.linear as L
from tik_kernels.contract import run_plan
from tik_kernels.contracts import get_contract
from tik_kernels.contracts.linear import CONTRACT, GPU_SIZES, projections

ROOT_SRC = Path(L.__file__).read_text()


_variant = functools.partial(variant, ROOT_SRC)


@pytest.fixture(scope="module")
def cpu_plan():
    return CONTRACT.plan("cpu", 0)


def test_contract_discovered():
    c = get_contract("linear")
    assert c is CONTRACT
    assert "BLOCK_K" in c.frozen_tunables
    assert {r.name for r in c.requirements} >= {"batch_invariance", "determinism", "accuracy", "gradient"}


def test_root_passes_cpu_contract(cpu_plan):
    results = run_plan(cpu_plan, L)
    assert results and not _failed(results), [(r.name, r.detail) for r in _failed(results)]
    names = {r.name for r in results}
    # sizes on both sides of the M8 / M64 bucket edge, backward invariance and the cancelling inputs
    assert "cancel[N=64,K=64]/batch_invariance[T=1]" in names
    assert "w[N=48,K=64]/batch_invariance[T=9]" in names
    assert "w[N=40,K=40]/batch_invariance[dx rows]" in names


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
    mod = _variant(tmp_path, "no_tail", "for k in range(0, tl.cdiv(K, BLOCK_K * K_UNROLL)):",
                   "for k in range(0, K // (BLOCK_K * K_UNROLL)):")
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
    ref = L._matmul(x, w, tile=(16, 16, 4, 2, 1), block_k=16)
    for tile in [(16, 16, 4, 2, 2), (16, 32, 4, 3, 4), (32, 16, 8, 4, 2), (64, 32, 4, 2, 1)]:
        y = L._matmul(x, w, tile=tile, block_k=16)
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), tile
    # the cancelling inputs make the reduction order visible: a different BLOCK_K moves bits
    other = L._matmul(x, w, tile=(16, 16, 4, 2, 1), block_k=32)
    assert not torch.equal(other.view(torch.int16), ref.view(torch.int16))


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
    assert set(L.CONFIG) == set(L.TUNABLES) and len(L._tile(1)) == 5
    for key, value in L.CONFIG.items():
        assert value in L.TUNABLES[key], key
    assert [L._bucket(m) for m in (1, 8, 9, 64, 65, 256, 1024, 1025, 16384)] == [
        "M8", "M8", "M64", "M64", "M256", "M256", "M1024", "MBIG", "MBIG"]


def test_cells_cover_the_projections():
    shapes = {(p.name, p.N, p.K) for p in projections()}
    assert ("qkv", 6144, 4096) in shapes and ("down", 4096, 14336) in shapes and len(shapes) == 6
    cells = CONTRACT.cells("gpu")
    assert len(cells) == 6 * 8 and len({c.name for c in cells}) == len(cells)
    assert all(c.coeff > 0 for c in cells)
    # equal weight per cell within a factor of a few: the floor-normalized objective
    small = next(c for c in cells if c.params["M"] == 1 and c.params["N"] == 4096 and c.params["K"] == 4096)
    big = next(c for c in cells if c.params["M"] == 16384 and c.params["N"] == 28672)
    assert small.coeff / big.coeff > 100
    case = CONTRACT.bench_case(CONTRACT.cells("cpu")[0], 0, "cpu")
    y, base = L.linear(*case.args), case.baseline()
    assert y.shape == base.shape and case.flops == 2 * 48 * 64


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
