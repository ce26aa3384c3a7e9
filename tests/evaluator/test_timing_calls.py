"""Calls per timed sample: how many back-to-back calls a graph-replayed sample holds (`timing._calls_per_sample`),
and the parent's refusal of a reply whose input variants do not fit its calls."""

from __future__ import annotations

import pytest
import torch
from evaluator_fixtures import FIX, tiny

from tik_kernels.evaluator import timing
from tik_kernels.evaluator.measure import timing_job
from tik_kernels.evaluator.protocol import ProtocolError


class FakeTimer:
    """Times every sample at a fixed µs and records whether the sample was a graph replay."""

    def __init__(self, us: float):
        self.us, self.graph = us, []

    def sample(self, fn, graph=False):
        self.graph.append(graph)
        return fn(), self.us, self.us


@pytest.mark.parametrize("us,calls", [(4.0, 16), (10.0, 8), (13.0, 4), (25.0, 2), (30.0, 2), (50.0, 1), (900.0, 1)])
def test_calls_fill_the_sample_target_in_powers_of_two(us, calls):
    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    loads, t = [], FakeTimer(us)
    got = timing._calls_per_sample(t, (Graph(), None), loads.append, [torch.zeros(4)])
    assert got == calls and got * us >= min(timing.SAMPLE_TARGET_US, timing.MAX_CALLS * us)
    # the estimate replays the root's one-call graph on variant 0, timed as a graph sample
    assert Graph.replays == 3 and loads == [0, 0, 0] and t.graph == [True] * 3


def test_calls_stop_where_the_input_sets_would_outgrow_memory():
    # half the cap per input set (float32, a view: counted by elements, no memory): two sets fit, four do not
    half = torch.zeros(1).expand(timing.MAX_SETS_BYTES // 8)
    graph = (type("G", (), {"replay": lambda s: None})(), None)
    assert timing._calls_per_sample(FakeTimer(1.0), graph, lambda v: None, [half]) == 2


def _reply(tmp_path):
    (tmp_path / "out").mkdir()
    job, _, read = timing_job(tiny(), [("root", FIX / "tiny_root.py"), ("candidate", FIX / "good.py")],
                              device="cpu", profile="cpu", seed=3, timeout=60, reps=2)
    return timing.run_timing_job(tmp_path, job), read


def test_parent_takes_a_reply_whose_variants_fit_its_calls(tmp_path):
    doc, read = _reply(tmp_path)
    assert all(c["calls"] == 1 for c in read(tmp_path / "out", doc)["cells"].values())
    cell = next(iter(doc["cells"].values()))
    cell["calls"], cell["seeds"] = 4, timing.variant_seeds(3, 4)
    assert {c["calls"] for c in read(tmp_path / "out", doc)["cells"].values()} == {1, 4}


@pytest.mark.parametrize("calls,n_seeds", [(4, 2), (1, 4), (timing.MAX_CALLS + 1, timing.MAX_CALLS + 1), (0, 2),
                                           (2.0, 2)])
def test_parent_refuses_variants_that_do_not_fit_the_calls(tmp_path, calls, n_seeds):
    doc, read = _reply(tmp_path)
    cell = next(iter(doc["cells"].values()))
    cell["calls"], cell["seeds"] = calls, timing.variant_seeds(3, n_seeds)
    with pytest.raises(ProtocolError):
        read(tmp_path / "out", doc)


def test_a_cell_of_one_variant_is_timed_on_one_and_the_parent_holds_it_to_that(tmp_path):
    """`Cell.variants`: the child rotates over the cell's own number of input variants, and the parent refuses
    a reply that used another number for it (the job's default, here) as it refuses any seeds it did not ask for."""
    (tmp_path / "out").mkdir()
    job, _, read = timing_job(tiny(), [("root", FIX / "tiny_root.py"), ("candidate", FIX / "good.py")],
                              device="cpu", profile="one_variant", seed=3, timeout=60, reps=2,
                              return_outputs=("candidate", "root"))
    doc = timing.run_timing_job(tmp_path, job)
    got = read(tmp_path / "out", doc)["cells"]
    assert got["tiny[T=32]"]["seeds"] == timing.variant_seeds(3, 1)
    assert len(got["tiny[T=32]"]["outputs"]["candidate"]) == 1
    assert got["tiny[T=8]"]["seeds"] == timing.variant_seeds(3, job["variants"]) and job["variants"] > 1
    doc["cells"]["tiny[T=32]"]["seeds"] = timing.variant_seeds(3, job["variants"])
    with pytest.raises(ProtocolError):
        read(tmp_path / "out", doc)


def test_rounds_are_precise_once_every_median_is_pinned_down():
    steady = {"event_us": [10.0, 10.01, 9.99, 10.0] * 5}
    noisy = {"event_us": [10.0, 12.0, 8.0, 11.0] * 5}
    assert timing.precise({"root": steady, "candidate": dict(steady)}, 0.003)
    # one implementation still noisy, or too few rounds to say: keep timing
    assert not timing.precise({"root": steady, "candidate": noisy}, 0.003)
    assert not timing.precise({"root": {"event_us": [10.0] * 7}}, 0.003)
    # the interval narrows as 1/sqrt(rounds): the noisy one (IQR 3.25 around 10.5) is known to ±10.9% at 20
    # rounds and to ±5.4% at 80
    assert not timing.precise({"c": noisy}, 0.1) and timing.precise({"c": noisy}, 0.11)
    assert timing.precise({"c": {"event_us": noisy["event_us"] * 4}}, 0.055)


def test_more_graph_instances_stop_at_the_first_capture_that_fails(monkeypatch):
    results = iter([("graph", {"root": "g1"}, None), ("graph", {"root": "g2"}, None), ("eager", {}, "root failed"),
                    ("graph", {"root": "g4"}, None)])
    monkeypatch.setattr(timing, "_capture_all", lambda fns, load, drop: next(results))
    assert timing._more_instances({}, None, None, 3) == [{"root": "g1"}, {"root": "g2"}]
    assert timing._more_instances({}, None, None, 0) == []


def test_a_replay_returns_the_tensors_its_capture_returned():
    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    out = [torch.zeros(2)]
    assert timing._replay((Graph(), out)) is out and Graph.replays == 1


def test_variant_inputs_are_held_once_each_beside_the_timed_set():
    """The timed set (the first case's tensors), a copy of it, and each other variant's tensors as its case built
    them: no second copy of a variant (attention's 32k decode cell ran an 80 GB card out of memory with one).
    A tensor a later case shares with the timed set (a cached weight, say) is copied: `load` overwrites the set."""
    shared = torch.ones(3)
    built = {}

    class Case:
        def __init__(self, seed):
            self.args = (torch.full((4,), float(seed)), shared)
            self.kwargs = {"scale": torch.tensor(float(seed))}
            built[seed] = self

    contract = type("C", (), {"bench_case": staticmethod(lambda cell, seed, device: Case(seed))})()
    case, pools = timing.variant_pools(contract, None, [5, 6, 7], "cpu")
    assert case is built[5] and len(pools) == 3
    ptr = [[t.untyped_storage().data_ptr() for t in p] for p in pools]
    timed = [t.untyped_storage().data_ptr() for t in timing.tensors_of(case.args, case.kwargs)]
    assert not set(ptr[0]) & set(timed) and torch.equal(pools[0][0], case.args[0])  # a copy of the set
    for seed, p in zip((6, 7), pools[1:], strict=True):
        assert p[0] is built[seed].args[0] and p[2] is built[seed].kwargs["scale"]  # as built, not copied
        assert p[1] is not shared and torch.equal(p[1], shared)  # shares storage with the set: copied


def test_out_of_memory_names_what_the_process_still_holds():
    """`_held_on_device`: large storages by dtype and shape, largest first, each storage once (a view of one is
    not counted again), small ones left out."""
    a = [torch.zeros(1 << 18) for _ in range(3)]  # 3 x 1 MiB
    b = torch.zeros(1 << 19, dtype=torch.float64)  # 4 MiB
    views = [b[:10], a[0][1:]]
    small = torch.zeros(16)
    got = timing._held_on_device(min_bytes=1 << 20, device_type="cpu")
    assert got.startswith("1 x float64[524288] 0.0 GiB, 3 x float32[262144] 0.0 GiB"), got
    assert "[10]" not in got and "[16]" not in got
    del a, b, views, small


def test_out_of_memory_diagnosis_steps_over_dead_weak_proxies():
    import weakref

    class Thing:
        pass

    t = Thing()
    proxy = weakref.proxy(t)
    del t  # the proxy now raises ReferenceError on any use, isinstance included
    holder = [proxy]
    assert timing._held_on_device(min_bytes=1 << 40, device_type="cpu") == ""
    del holder
