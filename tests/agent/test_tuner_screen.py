"""The tuner's successive halving: screens batches of moves, proposes the best survivor, remembers what it screened."""

import pytest
from agent_helpers import TOY_CONTRACT, TOY_SOURCE, fake_eval

from tik_tui.agent import NothingToPropose, ProposalContext
from tik_tui.agent.base import config_key, module_literal
from tik_tui.agent.loop import Search, SearchConfig
from tik_tui.agent.tuner import SCREEN_TIE, TunerProposer, rewrite_config


class FakeScreen:
    """Speedup = the fake evaluator's latency factor of the parent over the variant's (no noise)."""

    def __init__(self, parent_source, fail=False):
        self.parent_source, self.fail, self.calls = parent_source, fail, []

    def __call__(self, sources, rounds):
        self.calls.append((len(sources), rounds, [module_literal(s, "CONFIG") for s in sources]))
        if self.fail:
            return {"failure": "screen: timed out after 6 s (killed)", "results": []}
        f_p = fake_eval.factor(self.parent_source)
        return {"failure": None, "rounds": rounds, "seconds": 0.1, "parent_objective": f_p,
                "results": [{"speedup": f_p / fake_eval.factor(s), "error": None, "objective": fake_eval.factor(s),
                             "cells": {"small": f_p / fake_eval.factor(s)}} for s in sources]}


def _ctx(source, screen, width=6, tried=(), store=None, emit=None, pid=1):
    return ProposalContext(op="toy", parent={"id": pid, "status": "verified"}, parent_source=source,
                           contract=TOY_CONTRACT, tried_configs=set(tried), screen=screen, screen_width=width,
                           store=store, emit=emit)


def test_halving_rungs_and_the_best_survivor_is_proposed():
    screen = FakeScreen(TOY_SOURCE)
    tuner = TunerProposer(screen_rounds=4, eta=3)
    p = tuner.propose(_ctx(TOY_SOURCE, screen, width=6))
    # rung 0: 6 moves at 4 rounds; rung 1: the best 2 at 12 rounds, which is the last (a third would keep 1)
    assert [(n, r) for n, r, _ in screen.calls] == [(6, 4), (2, 12)]
    first = screen.calls[0][2]
    best = min(first, key=lambda c: fake_eval.factor(rewrite_config(TOY_SOURCE, c)))
    assert module_literal(p.source, "CONFIG") == best
    assert p.modification["screen"]["speedup"] > 1 and p.modification["screen"]["rounds"] == 12
    assert "screened" in p.rationale and "best of 6" in p.rationale
    # the survivors of rung 0 are its two fastest
    ranked = sorted(first, key=lambda c: fake_eval.factor(rewrite_config(TOY_SOURCE, c)))
    assert screen.calls[1][2] == ranked[:2]


def test_screened_configs_are_never_screened_again_and_the_pick_is_reused(tmp_path):
    from agent_helpers import make_toy_workspace

    ws, root = make_toy_workspace(tmp_path / "ws")
    try:
        def emit(kind, payload):
            ws.append_event(kind, payload, op="toy", impl_id=root)

        screen = FakeScreen(TOY_SOURCE)
        p1 = TunerProposer(screen_rounds=2).propose(_ctx(TOY_SOURCE, screen, store=ws, emit=emit, pid=root))
        events = ws.events(kind="screen", op="toy", impl_id=root)
        assert [e["payload"]["rung"] for e in events] == [0, 1] and events[-1]["payload"]["last"]
        assert isinstance(events[-1]["payload"]["pick"], int)
        # a worker killed before recording p1: a new tuner (new process) proposes the same pick without a screen
        again = FakeScreen(TOY_SOURCE)
        p2 = TunerProposer(screen_rounds=2).propose(_ctx(TOY_SOURCE, again, store=ws, emit=emit, pid=root))
        assert again.calls == [] and p2.source == p1.source
        # once p1 is tried, the next batch holds none of the configs screened before
        tried = {config_key(module_literal(p1.source, "CONFIG"))}
        p3 = TunerProposer(screen_rounds=2).propose(_ctx(TOY_SOURCE, again, tried=tried, store=ws, emit=emit,
                                                         pid=root))
        before = {config_key(c) for _, _, cs in screen.calls for c in cs}
        assert again.calls and not before & {config_key(c) for c in again.calls[0][2]}
        assert config_key(module_literal(p3.source, "CONFIG")) not in tried
    finally:
        ws.close()


def test_a_parent_no_move_beats_is_exhausted():
    best = rewrite_config(TOY_SOURCE, {"BLOCK": 128, "num_warps": 2, "SPLIT": 1})  # the fake optimum
    screen = FakeScreen(best)
    tuner = TunerProposer(screen_rounds=2)
    with pytest.raises(NothingToPropose, match="none of the .* was faster"):
        tuner.propose(_ctx(best, screen, width=3))
    # two fresh batches, each stopped at rung 0 (its best is slower than the parent)
    assert [(n, r) for n, r, _ in screen.calls] == [(3, 2), (3, 2)]


def test_a_failed_screen_is_recorded_and_the_tuner_goes_on_unscreened():
    screen = FakeScreen(TOY_SOURCE, fail=True)
    events = []
    tuner = TunerProposer()
    p = tuner.propose(_ctx(TOY_SOURCE, screen, emit=lambda k, pl: events.append((k, pl))))
    assert "unscreened: the screen failed" in p.rationale
    assert module_literal(p.source, "CONFIG") == screen.calls[0][2][0]
    assert [k for k, _ in events] == ["screen"] and "timed out" in events[0][1]["failure"]
    assert events[0][1]["pick"] is None


def test_no_screen_without_width_or_callable():
    screen = FakeScreen(TOY_SOURCE)
    TunerProposer().propose(_ctx(TOY_SOURCE, screen, width=1))
    TunerProposer().propose(_ctx(TOY_SOURCE, None, width=8))
    assert screen.calls == []


def test_the_loop_screens_with_one_slot_and_records_screens_in_the_ir(toy_ws):
    calls = []

    def screen(op, parent_source, sources, rounds):
        calls.append((op, len(sources), rounds))
        return FakeScreen(parent_source)(sources, rounds)

    cfg = SearchConfig(ops=["toy"], budget=3, screen=6, auto_promote=True)
    summary = Search(toy_ws, TunerProposer(screen_rounds=2), cfg, evaluate=fake_eval.evaluate, screen=screen).run()
    assert summary["spent"] == 3 and calls and all(op == "toy" for op, _, _ in calls)
    made = [toy_ws.implementation(i) for i in summary["derivations"]]
    assert all("screened" in r["rationale"] for r in made), [r["rationale"] for r in made]
    # each derivation is faster than its parent (explored branches need not beat the incumbent), or, where no
    # screened move was, within the screen's tie of it (a full evaluation decides those)
    for r in made:
        f, f_parent = fake_eval.factor(toy_ws.source(r["id"])), fake_eval.factor(toy_ws.source(r["parents"][0]))
        if "an evaluation decides" in r["rationale"]:
            assert f * (1 - SCREEN_TIE) <= f_parent
        else:
            assert f < f_parent
    assert made[0]["status"] == "promoted"
    screens = toy_ws.events(kind="screen", op="toy")
    assert screens and {e["impl_id"] for e in screens} <= {r["id"] for r in toy_ws.implementations(op="toy")}
    # off when the search does not screen
    calls.clear()
    Search(toy_ws, TunerProposer(), SearchConfig(ops=["toy"], budget=1), evaluate=fake_eval.evaluate,
           screen=screen).run()
    assert calls == []


def test_a_screen_event_reads_as_one_line():
    from tik_tui.agent.tuner import screen_summary

    p = {"rung": 1, "rounds": 18, "seconds": 19.4, "last": True, "pick": 0, "failure": None,
         "entries": [{"changed": {"M64_num_stages": 8}, "speedup": 1.0061}, {"changed": {"A": 1}, "speedup": None,
                                                                           "error": "OutOfResources"}]}
    line = screen_summary(p)
    # a time ratio like every other ratio TIK prints: parent speedup 1.0061 is 0.994× the parent's time
    assert line == ("screened 2 config(s), rung 1, 18 rounds/cell, 19 s: best M64_num_stages=8 0.994× parent, "
                    "1 failed; picked")
    assert "timed out" in screen_summary({**p, "failure": "screen: timed out after 6 s"})
    assert screen_summary({**p, "pick": None}).endswith("none faster than the parent")


class _TwoSlots:
    """An executor of two slots: evaluations through the fake evaluator, screens through FakeScreen; it keeps
    every job it was given."""

    name, slots, device = "fake", 2, "cuda"

    def __init__(self):
        self.jobs = []

    def submit(self, job):
        from concurrent.futures import Future

        from tik_tui.agent.jobs import Outcome, ScreenJob, run_job

        self.jobs.append(job)
        fut = Future()
        if isinstance(job, ScreenJob):
            fut.set_result(Outcome(screen=FakeScreen(job.parent_source)(job.sources, job.rounds)))
        else:
            fut.set_result(run_job(job, fake_eval.evaluate, {"executor": "fake"}))
        return fut

    def describe(self):
        return {"executor": "fake", "workers": 2}

    def close(self):
        pass


def test_with_several_workers_the_screen_is_a_job_for_the_executor(toy_ws):
    """Screening once turned itself off with more than one slot and ran in the search process; now each screen is
    a ScreenJob the executor runs like an evaluation (on a slot's device, also on Ray), with the root's source so
    the worker warms its compile cache."""
    from tik_tui.agent.jobs import ScreenJob

    ex = _TwoSlots()
    cfg = SearchConfig(ops=["toy"], budget=3, screen=6, auto_promote=True, time_it=True)
    summary = Search(toy_ws, TunerProposer(screen_rounds=2), cfg, executor=ex).run()
    screens = [j for j in ex.jobs if isinstance(j, ScreenJob)]
    assert summary["spent"] == 3 and screens
    root = toy_ws.root("toy")
    assert all(j.op == "toy" and j.root_source == toy_ws.source(root["id"]) and j.device == "cuda" for j in screens)
    made = [toy_ws.implementation(i) for i in summary["derivations"]]
    assert all("screened" in r["rationale"] for r in made), [r["rationale"] for r in made]


def test_a_screen_job_runs_the_real_screen_and_its_failure_comes_back_as_a_result():
    from tik_tui.agent.jobs import ScreenJob, run_job

    out = run_job(ScreenJob(op="rmsnorm", parent_source="raise SystemExit(3)\n", sources=["X = 1\n"], rounds=1,
                            device="cpu", timeout=60))
    assert out.error is None and out.screen is not None, out.error
    assert "the parent" in out.screen["failure"], out.screen["failure"]
    assert out.worker["finished"] >= out.worker["started"]


def test_a_root_that_fails_to_warm_in_the_worker_is_an_event_and_the_screen_goes_on(toy_ws):
    from dataclasses import replace

    class WarmFails(_TwoSlots):
        def submit(self, job):
            fut = super().submit(job)
            out = fut.result()
            if out.screen is not None:
                fut = type(fut)()
                fut.set_result(replace(out, warm_root_failure="RuntimeError: the root implementation failed"))
            return fut

    cfg = SearchConfig(ops=["toy"], budget=1, screen=6, auto_promote=True, time_it=True)
    summary = Search(toy_ws, TunerProposer(screen_rounds=2), cfg, executor=WarmFails()).run()
    assert summary["spent"] == 1
    warm = toy_ws.events(kind="warm_root_failed", op="toy")
    assert warm and warm[0]["payload"]["reason"].startswith("RuntimeError")


def test_a_move_within_the_screens_noise_of_the_parent_is_still_evaluated_and_the_next_proposal_screens_on():
    """On the H200, linear's root ended a search after 85 s: the best of 24 screened moves were 0.998-1.001x of it. A
    tie within SCREEN_TIE goes to a full evaluation instead, and the next proposal screens moves not yet seen."""

    class TieScreen(FakeScreen):
        def __call__(self, sources, rounds):
            out = super().__call__(sources, rounds)
            for k, r in enumerate(out["results"]):
                r["speedup"] = 0.999 - 0.0001 * k  # all a hair slower than the parent, the first closest
            return out

    screen = TieScreen(TOY_SOURCE)
    tuner, tried = TunerProposer(screen_rounds=2), {config_key(module_literal(TOY_SOURCE, "CONFIG"))}
    p = tuner.propose(_ctx(TOY_SOURCE, screen, width=3))
    assert "an evaluation decides" in p.rationale
    assert module_literal(p.source, "CONFIG") == screen.calls[0][2][0]  # the closest of the first batch
    first = {config_key(c) for _, _, cs in screen.calls for c in cs}
    tried.add(config_key(module_literal(p.source, "CONFIG")))
    n = len(screen.calls)
    p2 = tuner.propose(_ctx(TOY_SOURCE, screen, width=3, tried=tried))
    # the next proposal screens two batches of moves not seen yet, then evaluates the closest untried tie of all
    seen_now = [config_key(c) for _, _, cs in screen.calls[n:] for c in cs]
    assert len(screen.calls) == n + 2 and not set(seen_now) & first
    assert p2.modification["screen"]["speedup"] == 0.999
    assert config_key(module_literal(p2.source, "CONFIG")) not in tried
    # far from the parent (beyond the tie): exhausted, as before
    far = TunerProposer(screen_rounds=2, tie=0.0001)
    with pytest.raises(NothingToPropose, match="none of the .* was faster"):
        far.propose(_ctx(TOY_SOURCE, TieScreen(TOY_SOURCE), width=3))


def test_a_move_past_a_cells_limit_is_never_picked_however_fast_the_sum():
    """The H200's attention search: a move summing 0.998x its parent while one decode cell ran 1.36x (limit 1.05x)
    was picked, and every later derivation inherited that cell. Now the screen's per-cell ratios are held against
    the contract's limits: such a move is recorded as over its limit and the best move within every limit is
    proposed."""

    class CellScreen(FakeScreen):
        def __call__(self, sources, rounds):
            res = super().__call__(sources, rounds)
            res["limits"] = {"small": 0.05, "decode": 0.05}
            for s, r in zip(sources, res["results"], strict=True):
                # the variant that would win the sum slows the decode cell by 36%
                r["cells"]["decode"] = 1 / 1.36 if s == fastest else 1.0
            return res

    screen = CellScreen(TOY_SOURCE)
    tuner = TunerProposer(screen_rounds=4, eta=3)
    # find the sum's winner among the first batch the tuner screens, then screen again with it slowed
    probe = TunerProposer(screen_rounds=4, eta=3)
    plain = FakeScreen(TOY_SOURCE)
    winner = module_literal(probe.propose(_ctx(TOY_SOURCE, plain, width=6)).source, "CONFIG")
    fastest = rewrite_config(TOY_SOURCE, winner)
    p = tuner.propose(_ctx(TOY_SOURCE, screen, width=6))
    assert module_literal(p.source, "CONFIG") != winner
    first = screen.calls[0][2]
    assert winner in first
    within = [c for c in first if c != winner]
    assert module_literal(p.source, "CONFIG") == min(within, key=lambda c: fake_eval.factor(rewrite_config(TOY_SOURCE,
                                                                                                          c)))


def test_over_limit_reads_the_screens_ratio_against_the_cells_limit():
    from tik_tui.agent.tuner import over_limit, screen_summary

    assert over_limit({"a": 1.02, "b": 1 / 1.04}, {"a": 0.05, "b": 0.05}) is None
    assert over_limit({"a": 1.02, "b": 1 / 1.36}, {"a": 0.05, "b": 0.05}) == "b 1.360x > 1.050x"
    assert over_limit({"b": 1 / 1.36}, {}) is None  # a screen that names no limits filters nothing
    p = {"rung": 0, "rounds": 6, "seconds": 24, "last": True, "pick": None, "failure": None,
         "entries": [{"changed": {"X": 2}, "speedup": 1.002, "over_limit": "b 1.360x > 1.050x"},
                     {"changed": {"Y": 4}, "speedup": 0.999}]}
    assert screen_summary(p) == ("screened 2 config(s), rung 0, 6 rounds/cell, 24 s: best Y=4 1.001× parent, "
                                 "1 over a cell's limit; none faster than the parent")
