"""One language of numbers (time ×reference, below 1 is faster) and a reason for every status, in the UI, the
command line and the event log; the heatmap and progress views; a read-only workspace; quitting."""

from __future__ import annotations

import sys

import pytest
from tui_support import make_app, wait_for

from tik_store import Workspace
from tik_tui.cli.main import main
from tik_tui.events import describe
from tik_tui.screens.detail import DetailScreen
from tik_tui.verdict import explain
from tik_tui.widgets.heatmap import _columns, heatmap
from tik_tui.widgets.model import Poller
from tik_tui.widgets.progress_chart import chart

SIZE = (100, 30)


def _snap(path):
    with Workspace.open(path, readonly=True) as ws:
        return Poller().snapshot(ws)


# ------------------------------------------------------------------------------ why a status


def test_explain_names_the_cell_over_its_limit_and_the_incumbent_comparison(workspace):
    path, ids = workspace
    with Workspace.open(path, readonly=True) as ws:
        def why(name):
            return explain(ws.implementation(ids[name]), ws.measurements(ids[name]))

        assert why("inadmissible") == "not admissible: cell prefill_T512 at 1.143× root > limit 1.050× root"
        assert why("verified") == "not faster than the incumbent: objective 1.032× incumbent in the same run"
        assert why("eligible").startswith("eligible: every cell within its limit, objective 0.943× incumbent")
        assert why("failed") == "failed: batch_invariance failed"
        assert why("candidate") == "not evaluated yet"
    # a verified row with no timings says so, instead of a bare "verified"
    assert explain({"status": "verified", "parents": [1]}, []).startswith("not timed")


def test_best_points_only_at_eligible_or_promoted(workspace):
    """#7 (verified, over a cell limit) is the fastest overall; "best" must not name it."""
    path, ids = workspace
    snap = _snap(path)
    assert snap.ratios[ids["inadmissible"]] < snap.ratios[ids["eligible"]]
    assert snap.best("rmsnorm") == (ids["eligible"], pytest.approx(0.896, abs=1e-3))
    series = snap.best_series("rmsnorm")
    assert series == sorted(series, reverse=True) and series[-1] == pytest.approx(0.896, abs=1e-3)
    assert snap.incumbent_ratio("rmsnorm") == pytest.approx(0.95)


async def test_every_view_writes_the_incumbent_the_same_way(workspace):
    path, ids = workspace
    app = make_app(path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.pause()
        from tik_tui.widgets.derivation_tree import DerivationTree
        from tik_tui.widgets.overview import OperatorsTable, WorkerPanel

        overview = app.screen.query_one(OperatorsTable).get_row("rmsnorm")[3].plain
        tree = app.screen.query_one(DerivationTree)._op_label("rmsnorm").plain
        best = str(app.screen.query_one(WorkerPanel).query_one("#best-label").render())
        assert overview == "0.950×" and "incumbent #3 0.950× root" in tree
        assert f"best rmsnorm #{ids['eligible']} 0.896× root" in best
        app.open_detail(ids["inadmissible"])
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.detail is not None)
        head = str(app.screen.query_one("#detail-head").render())
        assert "time 0.895× root, 0.942× incumbent" in head
        assert "not admissible: cell prefill_T512 at 1.143× root > limit 1.050× root" in head
        cells_map = str(app.screen.query_one("#cells-map").render())
        assert "1.143!" in cells_map and "limit 1.05× root" in cells_map


# ------------------------------------------------------------------------------ the event log


@pytest.mark.parametrize("kind, payload, impl_id, expected", [
    ("exhausted", {"parent": 14, "reason": "#14: every allowed config around #14 was tried"}, 14,
     "nothing left to try: every allowed config around #14 was tried"),
    ("evaluated", {"id": 3, "status": "verified", "objective": 10.0, "incumbent_objective": 9.0}, 3,
     "verified, 1.111× incumbent: not faster than the incumbent"),
    ("evaluated", {"id": 3, "status": "verified", "objective": 8.0, "incumbent_objective": 9.0}, 3,
     "verified, 0.889× incumbent: not admissible, a cell is above its limit (tik show 3 says which)"),
    ("proposed", {"id": 5, "rationale": "tune BLOCK 64→128\nmore"}, 5, "proposed: tune BLOCK 64→128"),
    ("selected", {"parent": 2, "reason": "score 0.4"}, 2, "selected to derive from (score 0.4)"),
    ("search_finished", {"stop_reason": "budget of 2 derivations spent", "spent": 2}, None,
     "finished: budget of 2 derivations spent; 2 derivation(s)"),
    ("something_new", {"incumbent_objective": 14193.827999974928, "search": "s1"}, None,
     "incumbent objective 1.419e+04"),
])
def test_event_lines_are_sentences(kind, payload, impl_id, expected):
    line = describe(kind, payload, impl_id=impl_id)
    assert line == expected
    assert "=" not in line and (impl_id is None or f"#{impl_id}:" not in line)


# ------------------------------------------------------------------------------ pictures


def test_heatmap_columns_keep_what_varies_and_mark_cells_over_their_limit():
    cells = [{"cell": f"m/prefill[B={b},S={s}]", "median_us": 10 * r, "root_median_us": 10.0, "limit": 0.05,
              "incumbent_median_us": 10.0} for b, s, r in ((1, 1024, 0.9), (4, 1024, 1.2), (1, 4096, 1.0))]
    cells.append({"cell": "m/decode[T=1,H=4096]", "median_us": 9.0, "root_median_us": 10.0, "limit": 0.05})
    assert [s for _, s, _ in _columns(cells)] == ["B=1,S=1024", "B=4,S=1024", "B=1,S=4096", "T=1"]
    root = heatmap(cells, against="root").plain
    assert "1.200!" in root and "0.900 " in root and root.count("!") == 1
    inc = heatmap(cells, against="incumbent").plain
    assert "!" not in inc and "—" in inc  # no limit against the incumbent; the decode cell has no incumbent time


def test_progress_chart_marks_promotions_and_the_incumbent_level(workspace):
    path, ids = workspace
    text = chart(_snap(path), "rmsnorm", width=60).plain
    assert "●" in text and "★" in text and "━" in text
    assert "1.000×" in text and "0.895×" in text and "#1 … #7" in text


async def test_queue_shows_the_highlighted_candidates_heatmap_and_progress_tab(workspace):
    path, ids = workspace
    app = make_app(path, poll=False)
    async with app.run_test(size=(160, 36)) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.press("3")
        await pilot.pause()
        assert f"#{ids['eligible']} rmsnorm" in str(app.screen.query_one("#queue-map").render())
        table = app.screen.query_one("#queue-table")
        worst = table.get_row(str(ids["eligible"]))[5].plain
        assert worst == "decode_T1 0.920×"  # the whole worst-cell column, not cut
        await pilot.press("6")
        await pilot.pause()
        assert "rmsnorm  6 timed derivation(s)" in str(app.screen.query_one("#progress-charts").render())


# ------------------------------------------------------------------------------ the command line


def test_log_has_a_time_ratio_column_and_show_says_why(workspace, capsys):
    path, ids = workspace
    assert main(["-w", str(path), "log", "--op", "rmsnorm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "×root" in out[0] and "objective" not in out[0]
    rows = {line.split()[0]: line for line in out[1:]}
    assert "0.950×" in rows[str(ids["promoted"])] and "0.895×" in rows[str(ids["inadmissible"])]
    assert "e+" not in "\n".join(out)
    assert main(["-w", str(path), "show", str(ids["inadmissible"])]) == 0
    shown = capsys.readouterr().out
    assert "why verified: not admissible: cell prefill_T512 at 1.143× root > limit 1.050× root" in shown
    assert "over its limit" in shown and "0.942× incumbent" in shown


# ------------------------------------------------------------------------------ read-only, start, quit


async def test_a_read_only_workspace_opens_for_viewing(workspace, monkeypatch):
    import tik_store.workspace as sw

    path, ids = workspace
    monkeypatch.setattr(sw.os, "access", lambda p, mode: mode != sw.os.W_OK)
    app = make_app(path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        assert app.client.readonly and "read-only" in app.sub_title
        app.approve(ids["eligible"])
        await pilot.press("s")
        await pilot.pause(0.3)
        said = [n.message for n in app._notifications]
        assert any(f"cannot promote #{ids['eligible']}" in m and "read-only" in m for m in said), said
        assert any("cannot start a search" in m for m in said), said
    monkeypatch.undo()
    with Workspace.open(path) as ws:
        assert ws.implementation(ids["eligible"])["status"] == "eligible"


async def test_start_says_so_at_once_and_quit_says_the_worker_keeps_running(workspace, monkeypatch):
    from tik_tui.screens.dialogs import SearchRequest

    path, ids = workspace
    monkeypatch.setattr("tik_tui.app.TikApp._worker_alive", lambda self: True)
    app = make_app(path, poll=False, search_command=[sys.executable, "-c", "import time; time.sleep(1)"])
    said = []
    real_exit = app.exit
    app.exit = lambda *a, **k: (said.append(str(k.get("message"))), real_exit(*a, **k))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        app._start_search(SearchRequest(op=None, proposer="tuner", budget=2, auto_promote=False))
        await pilot.pause()  # before the spawned command (a 1 s sleep here) has answered
        assert any(n.message.startswith("starting a search") for n in app._notifications)
        await pilot.press("q")
        await pilot.pause()
    assert len(said) == 1 and "the worker keeps running (pid 4242" in said[0] and "tik stop" in said[0]


# ------------------------------------------------------------------------------ tik bench / tik e2e charts


def test_ratio_bars_diverge_from_one_and_flag_a_cell_over_its_limit():
    from tik_tui.cli.charts import ratio_bars, stacked_bars

    faster, over, unknown = ratio_bars([("a", 0.9, 1.05), ("b", 1.2, 1.05), ("c", None, None)], width=20, label_w=4)
    assert faster.index("█") < faster.index("│") and "┊" in faster and faster.endswith("0.900× root")
    assert over.index("│") < over.index("█") and over.endswith("1.200× root  over its limit")
    assert "—" in unknown
    a, b, legend = stacked_bars([("A", {"rollout": 2.0, "train": 1.0}), ("B", {"rollout": 1.0, "train": 1.0})],
                                width=30)
    assert a.count("█") == 20 and a.endswith("3.00 s") and b.count("█") == 10 and "█ rollout" in legend


def test_bench_prints_its_cells_as_a_chart(capsys, monkeypatch):
    import tik_kernels.evaluator as ev

    cells = [{"cell": "m/decode[T=1]", "median_us": 9.0, "spread_us": 0.1, "samples": 5, "root_median_us": 10.0,
              "baseline_median_us": 8.0, "ratio_vs_root": 0.9, "ratio_vs_baseline": 1.125, "limit": 0.05,
              "coeff": 1.0},
             {"cell": "m/decode[T=8]", "median_us": 12.0, "spread_us": 0.1, "samples": 5, "root_median_us": 10.0,
              "baseline_median_us": 8.0, "ratio_vs_root": 1.2, "ratio_vs_baseline": 1.5, "limit": 0.05, "coeff": 1.0}]

    class Report:
        verified = True

        def as_dict(self):
            return {"verified": True, "cells": cells, "objective": 21.0, "incumbent_objective": None,
                    "admissible": False, "eligible": False, "checks": [], "failure": None}

    monkeypatch.setattr(ev, "evaluate", lambda *a, **k: Report())
    assert main(["bench", "rmsnorm", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "×root" in out and "vs root" not in out
    assert "1.200× root  over its limit" in out and "0.900× root" in out
