"""On CUDA the rollout engine replays decode steps as CUDA graphs, one per batch bucket for the unified kernels:
the replayed steps must give the eager steps' tokens and log-probs bit for bit, under continuous batching."""

from __future__ import annotations

import random

import pytest
import torch

from tik_kernels.e2e.backends import (
    NO_PDL_CONFIG,
    PDL_CONFIG,
    PDL_PREFETCH_CONFIG,
    config_overrides,
    make_backend,
)
from tik_kernels.e2e.model import PRESETS, init_params
from tik_kernels.e2e.rollout import RolloutEngine
from tik_kernels.e2e.run import E2EConfig, run_e2e
from tik_kernels.e2e.task import make_requests

pytestmark = pytest.mark.gpu


def _bits(comps):
    return [(c.tokens, c.old_logprobs().view(torch.int32).tolist()) for c in comps]


def test_graph_decode_equals_eager_decode_bitwise_unified():
    mc = PRESETS["small"].with_layers(2)
    params = init_params(mc, 0, "cuda")
    be = make_backend("unified")
    reqs = make_requests(mc.vocab, 6, 3, random.Random(0), prompt_len=(8, 40), answer_len=(4, 24))
    kw = dict(max_slots=8, max_len=64, admit_per_step=3, device="cuda")
    eager = RolloutEngine(mc, be, graphs=False, **kw)
    graph = RolloutEngine(mc, be, graphs=True, **kw)
    want = eager.generate(params, reqs)
    got = graph.generate(params, reqs)
    assert len(set(eager.stats.batch_sizes)) >= 3  # the batch really changed
    assert _bits(got) == _bits(want)
    # one graph per bucket the steps used, captured once and replayed after
    assert graph.stats.graphs_captured == len(set(graph.stats.buckets)) < graph.stats.decode_steps
    again = graph.generate(params, reqs)
    assert _bits(again) == _bits(want)
    assert graph.stats.graphs_captured == len(set(graph.stats.buckets))


@pytest.mark.parametrize("preset, layers, over", [("small", 2, PDL_CONFIG), ("qwen3-0.6b", 2, PDL_CONFIG),
                                                 ("qwen3-0.6b", 2, PDL_PREFETCH_CONFIG)])
def test_pdl_graph_decode_equals_eager_decode_bitwise(preset, layers, over):
    """With programmatic dependent launch every kernel of the decode step may start before the one before it ends and
    waits for it in its first instruction (the linear's weight prefetch before it): the replayed steps (PDL on,
    captured) give the eager steps' bits (PDL off), under continuous batching, at a shape whose decode splits its
    attention (qwen3-0.6b: fused merge)."""
    from tik_kernels.ops._common import pdl_capable

    if not pdl_capable(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 and a Triton that has it")
    mc = PRESETS[preset].with_layers(layers)
    params = init_params(mc, 0, "cuda")
    reqs = make_requests(mc.vocab, 6, 3, random.Random(2), prompt_len=(8, 200), answer_len=(4, 40))
    kw = dict(max_slots=8, max_len=256, admit_per_step=3, device="cuda")
    be = make_backend("unified")
    with config_overrides(NO_PDL_CONFIG):
        want = RolloutEngine(mc, be, graphs=False, **kw).generate(params, reqs)
    with config_overrides(over):
        graph = RolloutEngine(mc, be, graphs=True, **kw)
        got = graph.generate(params, reqs)
        eager = RolloutEngine(mc, be, graphs=False, **kw).generate(params, reqs)
    assert graph.stats.graphs_captured > 0
    assert _bits(got) == _bits(want)
    assert _bits(eager) == _bits(want)


def test_stock_decode_graphs_run_per_batch_and_kv_bucket():
    mc = PRESETS["small"].with_layers(2)
    params = init_params(mc, 0, "cuda")
    reqs = make_requests(mc.vocab, 4, 3, random.Random(1), prompt_len=(8, 90), answer_len=(4, 40))
    eng = RolloutEngine(mc, make_backend("stock"), max_slots=8, max_len=140, device="cuda")
    out = eng.generate(params, reqs)
    assert all(len(c.tokens) == c.request.max_new for c in out)
    assert eng.stats.graphs_captured >= len(set(eng.stats.buckets))


def test_mode_b_with_graphs_matches_the_trainer():
    cfg = E2EConfig(preset="small", layers=2, modes=("A", "B"), steps=1, prompts=4, group=4, device="cuda")
    out = run_e2e(cfg)
    b = out["modes"]["B"]
    assert b["decode_graphs"] and b["graphs_captured"] > 0
    assert b["equal_tokens"] == b["tokens"] > 0
    a = out["modes"]["A"]  # the stock engine's compositions compiled by inductor, inside its captured decode steps
    assert a["stock_compiled"] and a["stock_compile_errors"] == {} and a["decode_graphs"], a["stock_compile_errors"]


@pytest.mark.parametrize("backend", ["stock", "unified"])
def test_decode_bench_times_one_captured_step(backend):
    from tik_kernels.e2e.decode_bench import time_decode

    r = time_decode(PRESETS["small"].with_layers(2), make_backend(backend), batch=8, context=64, graphs=True,
                    reps=3, rounds=2)
    assert r["graphs_captured"] == 1 and r["replay_ms"] > 0 and r["step_ms"] >= r["replay_ms"] * 0.5
    assert r["floor_ms"] > 0 and r["step_over_floor"] > 1
