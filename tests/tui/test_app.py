"""The UI against a real workspace: live updates, decisions, run control, errors, empty states."""

from __future__ import annotations

import json
import sys

import pytest
from tui_support import make_app, wait_for

from tik_store import Workspace
from tik_tui.screens.detail import DetailScreen
from tik_tui.screens.dialogs import RejectDialog, StartSearchDialog
from tik_tui.widgets.derivation_tree import DerivationTree
from tik_tui.widgets.history import HistoryTable
from tik_tui.widgets.overview import EventLog, OperatorsTable

SIZE = (100, 30)


async def test_overview_shows_operators_and_incumbent_time_ratio(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.pause()
        table = app.screen.query_one(OperatorsTable)
        assert table.row_count == 3
        row = [c.plain if hasattr(c, "plain") else c for c in table.get_row("rmsnorm")]
        assert row[1] == f"#{ids['root']}" and row[2] == f"#{ids['promoted']}"
        assert row[3] == "0.950×"  # the incumbent's time ×root: 142.5 / 150, below 1 is faster
        assert row[5] == "1"  # one eligible candidate waits
        assert app.screen.query_one("#recent-events", EventLog).count > 10


async def test_new_derivations_and_events_appear_after_polling(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        log = app.screen.query_one("#all-events", EventLog)
        before = log.count
        with Workspace.open(path) as ws:
            new = ws.add_implementation("rmsnorm", "# a new derivation\n", parents=[ids["eligible"]],
                                        proposer="replay", rationale="recorded")
            ws.append_event("evaluating", {"id": new}, op="rmsnorm", impl_id=new)
        await wait_for(pilot, lambda: new in app.snapshot.impls)
        await pilot.pause()
        assert log.count >= before + 2
        assert new in app.evaluating
        tree = app.screen.query_one(DerivationTree)
        await pilot.pause()
        assert new in tree._impl_nodes  # revealed live, its ancestors expanded
        assert "evaluating" in tree._impl_nodes[new].label.plain
        await pilot.press("4")
        assert str(new) in [str(k.value) for k in app.screen.query_one(HistoryTable).rows]


async def test_approve_only_from_the_queue_writes_a_decision(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.press("a")  # on the overview: no approve binding, nothing happens
        app.open_detail(ids["verified"])  # verified, not eligible: a and r do nothing
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.detail is not None)
        await pilot.press("a", "r")
        await pilot.pause(0.2)
        assert isinstance(app.screen, DetailScreen)
        with Workspace.open(path) as ws:
            assert ws.decisions() == [d for d in ws.decisions() if d["by"] == "test"]
        await pilot.press("escape", "3", "a")
        await wait_for(pilot, lambda: not app.snapshot.queue)
    with Workspace.open(path) as ws:
        assert ws.implementation(ids["eligible"])["status"] == "promoted"
        assert ws.incumbent("rmsnorm")["id"] == ids["eligible"]
        [d] = ws.decisions(ids["eligible"])
        assert d["action"] == "promote" and d["by"].startswith("tui:")


async def test_reject_asks_for_a_reason_and_refuses_an_empty_one(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.press("3", "r")
        assert isinstance(app.screen, RejectDialog)
        await pilot.press("enter")  # empty reason: stays open, nothing written
        assert isinstance(app.screen, RejectDialog)
        await pilot.press(*"slower on H100", "enter")
        await wait_for(pilot, lambda: not app.snapshot.queue)
    with Workspace.open(path) as ws:
        [d] = ws.decisions(ids["eligible"])
        assert (d["action"], d["reason"]) == ("reject", "slower on H100")
        assert ws.implementation(ids["eligible"])["status"] == "rejected"


async def test_detail_shows_checks_cells_and_diff(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        app.open_detail(ids["failed"])
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.detail is not None)
        d = app.screen.detail
        assert "-CONFIG = {\"BLOCK_N\": 128" in d["diff"] and "+CONFIG = {\"BLOCK_N\": 64" in d["diff"]
        checks = app.screen.query_one("#checks-table")
        assert checks.row_count == 4
        assert checks.get_row_at(0)[0].plain == "FAIL"
        # names are shown literally, brackets and all (they were read as markup)
        assert [checks.get_row_at(i)[1].plain for i in range(4)][:3] == [
            "batch_invariance", "accuracy", "batch_invariance[permuted]"]
        await pilot.press("u")  # to the parent: the root
        await wait_for(pilot, lambda: app.screen.impl_id == ids["root"] and app.screen.detail is not None)
        assert app.screen.query_one("#cells-table").row_count == 3


async def test_pause_and_stop_send_commands_only_to_a_live_worker(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.press("p")
        await pilot.pause(0.3)
        await pilot.press("x", "y")
        await pilot.pause(0.3)
        with Workspace.open(path) as ws:
            assert [c["kind"] for c in ws.take_commands()] == ["pause", "stop"]
            ws.set_worker_state(state="crashed", message="RuntimeError: CUDA out of memory")
        await wait_for(pilot, lambda: app.snapshot.worker.get("state") == "crashed")
        await pilot.pause()
        assert "CUDA out of memory" in str(app.screen.query_one("#worker-message").render())
        await pilot.press("p", "x")
        await pilot.pause(0.3)
    with Workspace.open(path) as ws:
        assert ws.take_commands() == []


async def test_start_search_spawns_a_detached_process_and_shows_its_errors(workspace, tmp_path):
    path, ids = workspace
    with Workspace.open(path) as ws:
        ws.set_worker_state(state="finished")
    record = tmp_path / "argv.json"
    fake = [sys.executable, "-c", f"import json, sys; json.dump(sys.argv[1:], open({str(record)!r}, 'w'))"]
    app = make_app(path, search_command=fake)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.press("s")
        assert isinstance(app.screen, StartSearchDialog)
        budget = app.screen.query_one("#budget")
        budget.value = "3"
        budget.focus()
        await pilot.press("enter")  # enter in a field starts it
        await wait_for(pilot, lambda: record.exists(), timeout=20)
        argv = json.loads(record.read_text())
        assert argv == ["-w", str(path), "search", "--detach", "--proposer", "tuner", "--budget", "3", "--time"]
        # a start that fails (here: no API key) is shown, never raised
        app.search_command = [sys.executable, "-c", "import sys; sys.exit('tik: error: ANTHROPIC_API_KEY is not set')"]
        await pilot.press("s")
        app.screen.query_one("#budget").focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("ANTHROPIC_API_KEY" in n.message for n in app._notifications), timeout=20)


async def test_history_filter_and_goto(workspace):
    path, ids = workspace
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        table = app.screen.query_one(HistoryTable)
        table.max_rows = 4  # a big workspace shows the newest rows and says so
        await pilot.press("4")
        assert [r.key.value for r in table.ordered_rows] == ["10", "9", "8", "7"]
        assert "10 of 10 derivations (newest 4" in str(app.screen.query_one("#history-count").render())
        await pilot.press("slash", *"claude")
        await pilot.pause()
        assert [k.value for k in table.rows] == [str(ids["eligible"])]
        await pilot.press("enter", "enter")  # leave the filter, open the row
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert app.screen.impl_id == ids["eligible"]
        await pilot.press("escape", "g", *str(ids["failed"]), "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert app.screen.impl_id == ids["failed"]


async def test_empty_workspace_says_what_to_do(tmp_path):
    Workspace.init(tmp_path / "empty").close()
    app = make_app(tmp_path / "empty")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.pause()
        assert app.screen.query_one("#empty-workspace").display
        assert "tik init" in str(app.screen.query_one("#empty-workspace").render())


@pytest.mark.parametrize("argv", [["tui"], []], ids=["tik-tui", "bare-tik"])
def test_cli_errors_before_the_app_without_a_workspace(tmp_path, capsys, argv):
    from tik_tui.cli.main import main

    assert main(["-w", str(tmp_path / "nope"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"tik: error: no TIK workspace at {tmp_path / 'nope'} (run `tik init`)"


def test_config_file_sets_theme_and_keymap(tmp_path, monkeypatch):
    from tik_tui.config import ConfigError, load_config

    cfg = tmp_path / "config.toml"
    cfg.write_text('theme = "textual-light"\npoll_interval = 2\n[keymap]\n"queue.approve" = "y"\n')
    monkeypatch.setenv("TIK_CONFIG", str(cfg))
    c = load_config()
    assert (c.theme, c.poll_interval, c.keymap) == ("textual-light", 2.0, {"queue.approve": "y"})
    cfg.write_text("poll_interval = 0\n")
    with pytest.raises(ConfigError, match="poll_interval"):
        load_config()


async def test_keymap_override_help_and_palette(workspace):
    from tik_tui.config import UiConfig

    path, ids = workspace
    app = make_app(path, config=UiConfig(poll_interval=0.1, keymap={"queue.approve": "y"}))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.loaded)
        await pilot.press("3", "a")
        await pilot.pause(0.3)
        assert app.snapshot.queue
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.snapshot.queue)
        await pilot.press("f1")  # help panel on, then off
        await pilot.pause()
        assert app.screen.query("HelpPanel")
        await pilot.press("f1")
        await pilot.pause()
        assert not app.screen.query("HelpPanel")
        # the command palette jumps to a derivation by id
        await pilot.press("ctrl+p", *f"#{ids['failed']}")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert app.screen.impl_id == ids["failed"]
