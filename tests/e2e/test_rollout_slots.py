"""The rollout engine's decode bookkeeping, checked on the CPU with graphs off: batch buckets, the padded rows'
slots, which request holds which KV-cache slot. On CUDA the same padded steps are captured once per bucket and
replayed (tests/e2e/test_decode_graphs_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from tik_kernels.e2e.backends import make_backend
from tik_kernels.e2e.model import PRESETS, KVCache, init_params
from tik_kernels.e2e.rollout import (
    DEFAULT_BUCKETS,
    Request,
    RolloutEngine,
    SlotTable,
    bucket_sizes,
    kv_bucket,
    pick_bucket,
)


def test_buckets():
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert bucket_sizes(50) == [1, 2, 4, 8, 16, 24, 32, 48, 50]  # the slot count closes the list
    assert bucket_sizes(4, (4,)) == [4]
    assert set(bucket_sizes(1000)) >= set(DEFAULT_BUCKETS)
    sizes = bucket_sizes(64)
    assert [pick_bucket(n, sizes) for n in (1, 3, 8, 9, 33, 64)] == [1, 4, 8, 16, 48, 64]
    with pytest.raises(ValueError, match="exceed"):
        pick_bucket(65, sizes)
    assert [kv_bucket(n, 300) for n in (1, 64, 65, 200, 257, 300)] == [64, 64, 128, 256, 300, 300]


def test_slot_table_keeps_the_active_requests_in_the_first_slots():
    t = SlotTable(4)
    assert [t.admit(x) for x in "abc"] == [0, 1, 2]
    assert t.release(0) == (2, 0)  # the last holder fills the hole
    assert t.holders == ["c", "b"]
    assert t.release(1) is None  # the last slot: nothing moves
    assert t.admit("d") == 1 and t.free() == 2
    with pytest.raises(ValueError, match="not held"):
        t.release(2)
    t.admit("e")
    t.admit("f")
    with pytest.raises(ValueError, match="all 4 slots"):
        t.admit("g")


def _requests():
    # the first one leaves first, so the last one moves into its slot while the others decode on
    return [Request([5, 9, 11, 2], 2, seed=1), Request([7, 3], 4, seed=2), Request([1, 2, 3, 4, 5, 6], 4, seed=3)]


@pytest.fixture(scope="module")
def setup():
    mc = PRESETS["tiny"]
    be = make_backend("unified")
    params = init_params(mc, 2)
    exact = RolloutEngine(mc, be, max_slots=4, max_len=12, admit_per_step=3)
    ref = exact.generate(params, _requests())
    return mc, be, params, exact, ref


def _same(a, b) -> bool:
    return all(x.tokens == y.tokens
               and torch.equal(x.old_logprobs().view(torch.int32), y.old_logprobs().view(torch.int32))
               for x, y in zip(a, b, strict=True))


def test_padded_steps_give_the_exact_steps_bits(setup):
    """Every decode step padded to 4 rows (pad rows in the free slots) gives what steps at their own size give."""
    mc, be, params, exact, ref = setup
    assert exact.stats.buckets == exact.stats.batch_sizes  # no buckets: each step at its own size
    padded = RolloutEngine(mc, be, max_slots=4, max_len=12, admit_per_step=3, graphs=False, buckets=(4,))
    out = padded.generate(params, _requests())
    assert set(padded.stats.buckets) == {4} and set(padded.stats.batch_sizes) == {2, 3}
    assert _same(out, ref)


def test_prefill_token_budget_admits_and_keeps_the_bits(setup):
    """`prefill_tokens` caps the prompt tokens of one packed prefill (a longer prompt still joins alone); how the
    requests are grouped into prefills changes nothing in any request's tokens or log-prob bits."""
    mc, be, params, exact, ref = setup
    seen = []
    for budget in (10_000, 6, 1):  # prompts of 4, 2 and 6 tokens: one prefill, then 4 + 2 and 6, then one each
        eng = RolloutEngine(mc, be, max_slots=4, max_len=12, prefill_tokens=budget)
        out = eng.generate(params, _requests())
        seen.append(eng.stats.prefills)
        assert _same(out, ref), budget
    assert seen == [1, 2, 3]
    with pytest.raises(ValueError, match="prefill_tokens"):
        RolloutEngine(mc, be, max_slots=4, max_len=12, prefill_tokens=0)


def _reads(monkeypatch) -> list:
    """Count the engine's read-backs: every device-to-host read of a result goes through `Tensor.tolist`."""
    calls = []
    real = torch.Tensor.tolist

    def tolist(self):
        calls.append(tuple(self.shape))
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    return calls


@pytest.mark.parametrize("buckets", [None, (4,)])
def test_the_host_reads_back_once_and_the_bits_are_those_of_reading_every_step(setup, monkeypatch, buckets):
    """With `overlap` (the default) the loop never waits for a step: the next step's token ids come from the
    device, and every token and log-prob is read back once, at the end. Reading every step back before the next
    (`overlap=False`, the loop as it was) gives the same tokens and log-prob bits, with slots moving and
    requests of one token that end at their prefill."""
    mc, be, params, exact, ref = setup
    reqs = _requests() + [Request([4, 4, 8], 1, seed=4), Request([9], 3, seed=5)]
    kw = dict(max_slots=4, max_len=12, admit_per_step=3, graphs=False, buckets=buckets)
    step = RolloutEngine(mc, be, overlap=False, **kw)
    reads = _reads(monkeypatch)
    want = step.generate(params, reqs)
    per_step = len(reads)
    reads.clear()
    eng = RolloutEngine(mc, be, **kw)
    got = eng.generate(params, reqs)
    assert _same(got, want) and _same(got[:3], ref)
    assert [len(c.tokens) for c in got] == [2, 4, 4, 1, 3] == [c.made for c in got]
    assert len(reads) == 2  # the tokens, the log-probs: once
    assert per_step >= 2 * (step.stats.decode_steps + step.stats.prefills)
    assert eng.stats.decode_steps == step.stats.decode_steps


def test_a_token_id_left_behind_by_a_slot_move_is_caught(setup, monkeypatch):
    """The next step's ids are the device's last sampled tokens, by slot: a move that takes the request's cache but
    leaves its token behind changes what the request that moved generates."""
    mc, be, params, exact, ref = setup
    monkeypatch.setattr(RolloutEngine, "_move_slot", lambda self, src, dst: self.cache.move(src, dst))
    broken = RolloutEngine(mc, be, max_slots=4, max_len=12, admit_per_step=3, graphs=False, buckets=(4,))
    out = broken.generate(params, _requests())
    assert out[0].tokens == ref[0].tokens and not _same(out, ref)


def test_a_slot_move_left_out_is_caught(setup, monkeypatch):
    """The check above has teeth: an engine that forgets to move a request's cache with it differs."""
    mc, be, params, exact, ref = setup
    monkeypatch.setattr(KVCache, "move", lambda self, src, dst: None)
    broken = RolloutEngine(mc, be, max_slots=4, max_len=12, admit_per_step=3, graphs=False, buckets=(4,))
    assert not _same(broken.generate(params, _requests()), ref)


def test_graphs_need_cuda():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        RolloutEngine(PRESETS["tiny"], make_backend("stock"), device="cpu", graphs=True)


@pytest.fixture
def fake_graphs(monkeypatch):
    """torch.cuda's graph API faked on the CPU: a capture records the step (and computes nothing, as a real capture
    does not: the outputs are poisoned, so a step that is not replayed shows), a replay runs it. `fake.fail` makes
    captures raise, as an op that waits on the GPU does."""
    import contextlib
    from types import SimpleNamespace

    from tik_kernels.e2e import rollout

    fake = SimpleNamespace(fail=False, capturing=[])

    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        def replay(self):
            self.run()

    real_step = rollout.RolloutEngine._step

    def step(self, b, kv):
        if fake.capturing:
            if fake.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            fake.capturing[-1].run = lambda: real_step(self, b, kv)
            self._tok.fill_(-1)
            self._lp.fill_(float("nan"))
            return
        real_step(self, b, kv)

    @contextlib.contextmanager
    def graph(g, pool=None):
        fake.capturing.append(g)
        try:
            yield
        finally:
            fake.capturing.pop()

    for name, value in (("Stream", Stream), ("current_stream", Stream), ("stream", lambda s: contextlib.nullcontext()),
                        ("graph_pool_handle", object), ("CUDAGraph", Graph), ("graph", graph),
                        ("synchronize", lambda: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(rollout.RolloutEngine, "_step", step)
    return fake


def _graph_engine(mc, be):
    eng = RolloutEngine(mc, be, max_slots=4, max_len=12, admit_per_step=3)
    eng.graphs, eng.buckets = True, bucket_sizes(4)  # what a CUDA engine has
    return eng


def test_graph_path_captures_once_per_bucket_and_replays(setup, fake_graphs):
    mc, be, params, exact, ref = setup
    eng = _graph_engine(mc, be)
    out = eng.generate(params, _requests())
    assert _same(out, ref)
    used = set(eng.stats.buckets)
    assert eng.stats.graphs_captured == len(used) < eng.stats.decode_steps
    assert sorted(eng._graphs) == [(b, 12) for b in sorted(used)]  # unified: the KV length is the capacity
    assert eng.stats.graph_error is None


def test_a_failed_capture_falls_back_to_eager_steps_and_says_so(setup, fake_graphs, capsys):
    mc, be, params, exact, ref = setup
    fake_graphs.fail = True
    eng = _graph_engine(mc, be)
    out = eng.generate(params, _requests())
    assert _same(out, ref)
    assert not eng.graphs and eng.stats.graphs_captured == 0
    assert "operation not permitted" in eng.stats.graph_error
    assert "running eagerly" in capsys.readouterr().err
