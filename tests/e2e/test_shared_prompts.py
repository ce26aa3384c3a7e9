"""A GRPO group's prompt prefilled once (`RolloutEngine(share_prompts=True)`, the default): the others' slots get a
copy of its keys and values and its last row. With TIK's kernels every token and log-prob is the bit pattern the
separate prefills gave, whatever the prefill budget cuts the queue into; the prefill computes one prompt a group."""

from __future__ import annotations

import random

import pytest
import torch

from tik_kernels.e2e.backends import StockBackend, UnifiedBackend
from tik_kernels.e2e.model import PRESETS, KVCache, init_params
from tik_kernels.e2e.rollout import RolloutEngine
from tik_kernels.e2e.task import make_requests


def _run(share: bool, reqs, *, prefill_tokens=4096, max_slots=6, backend=None):
    mc = PRESETS["tiny"]
    eng = RolloutEngine(mc, backend or UnifiedBackend(), max_slots=max_slots, max_len=24,
                        prefill_tokens=prefill_tokens, share_prompts=share)
    out = eng.generate(init_params(mc, 3), reqs)
    return out, eng.stats


def test_shared_prompts_give_the_separate_prefills_bits():
    mc = PRESETS["tiny"]
    reqs = make_requests(mc.vocab, 3, 3, random.Random(11), prompt_len=(2, 7), answer_len=(2, 6))
    for budget, slots in ((4096, 9), (4096, 4), (9, 6)):  # all at once; slots freed one by one; small prefills
        a, sa = _run(True, reqs, prefill_tokens=budget, max_slots=slots)
        b, sb = _run(False, reqs, prefill_tokens=budget, max_slots=slots)
        assert [c.tokens for c in a] == [c.tokens for c in b], (budget, slots)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.old_logprobs().view(torch.int32), y.old_logprobs().view(torch.int32)), (budget, slots)
        assert sb.shared_prompts == 0 and sb.prefill_tokens == sum(len(r.prompt) for r in reqs)
        assert sa.prefill_tokens <= sb.prefill_tokens
    # all nine join one prefill: each group's prompt computed once, two of three copied
    _, sa = _run(True, reqs, max_slots=9)
    assert sa.prefills == 1 and sa.shared_prompts == 6
    assert sa.prefill_tokens == sum({tuple(r.prompt): len(r.prompt) for r in reqs}.values())


def test_a_shared_prompt_costs_no_prefill_budget():
    """Nine requests of three prompts, each group in a row in the queue, with a budget of one prompt's tokens and a
    bit: a group joins one prefill together (its copies are free), where without sharing each request needs its own.
    Admission stays first come, first served: a different prompt that does not fit waits for the next prefill."""
    mc = PRESETS["tiny"]
    reqs = sorted(make_requests(mc.vocab, 3, 3, random.Random(2), prompt_len=(5, 5), answer_len=(2, 2)),
                  key=lambda r: r.group)
    _, sa = _run(True, reqs, prefill_tokens=6, max_slots=9)
    _, sb = _run(False, reqs, prefill_tokens=6, max_slots=9)
    assert (sa.prefills, sa.shared_prompts, sb.prefills) == (3, 6, 9)
    # a budget below one prompt: the first request of a prefill joins whatever its length, and its copies with it
    _, s1 = _run(True, reqs, prefill_tokens=1, max_slots=9)
    assert (s1.prefills, s1.shared_prompts) == (3, 6)


def test_copy_prefix_copies_every_layer_s_first_positions():
    mc = PRESETS["tiny"]
    cache = KVCache(mc, 6, 10, "cpu")
    g = torch.Generator().manual_seed(0)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    k0, v0 = cache.k.clone(), cache.v.clone()
    KVCache.COPY_SLOTS, old = 1, KVCache.COPY_SLOTS  # more than one chunk of a length
    try:
        cache.copy_prefix([0, 0, 3], [1, 2, 5], [4, 4, 7])
    finally:
        KVCache.COPY_SLOTS = old
    for s, d, n in ((0, 1, 4), (0, 2, 4), (3, 5, 7)):
        assert torch.equal(cache.k[:, d, :, :n], k0[:, s, :, :n]) and torch.equal(cache.v[:, d, :, :n], v0[:, s, :, :n])
        assert torch.equal(cache.k[:, d, :, n:], k0[:, d, :, n:])  # the rest of the slot untouched
        assert torch.equal(cache.v[:, d, :, n:], v0[:, d, :, n:])
    assert torch.equal(cache.k[:, [0, 3, 4]], k0[:, [0, 3, 4]])


def test_the_stock_backend_shares_prompts_too():
    """The same engine for every mode: stock kernels run the shared prefill as well (their bits may differ from
    separate prefills, as they differ with any batch)."""
    mc = PRESETS["tiny"]
    reqs = make_requests(mc.vocab, 2, 3, random.Random(4), prompt_len=(3, 6), answer_len=(2, 4))
    out, st = _run(True, reqs, max_slots=6, backend=StockBackend())
    assert st.shared_prompts == 4 and all(len(c.tokens) == c.request.max_new for c in out)


@pytest.mark.gpu
def test_on_the_gpu_shared_prompts_give_the_separate_prefills_bits():
    """At qwen3-0.6b's widths (2 layers), on CUDA with graphs: 8 prompts x 4 samples, prompts of 32-96 tokens, the
    same tokens and log-prob bits with and without the shared prefill."""
    mc = PRESETS["qwen3-0.6b"].with_layers(2)
    params = init_params(mc, 0, "cuda")
    reqs = make_requests(mc.vocab, 8, 4, random.Random(1), prompt_len=(32, 96), answer_len=(8, 24))
    outs = []
    for share in (True, False):
        eng = RolloutEngine(mc, UnifiedBackend(), max_slots=32, max_len=128, device="cuda", share_prompts=share)
        outs.append(eng.generate(params, reqs))
        assert (eng.stats.shared_prompts > 0) == share
    a, b = outs
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert all(torch.equal(x.old_logprobs().view(torch.int32), y.old_logprobs().view(torch.int32))
               for x, y in zip(a, b, strict=True))
