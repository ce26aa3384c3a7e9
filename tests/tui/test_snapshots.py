"""Pictures of the main screens at 100x30 (`pytest --snapshot-update` rewrites them after a deliberate change)."""

from __future__ import annotations

from tui_support import make_app, wait_for

SIZE = (100, 30)


def _before(*keys, detail: int | None = None):
    async def run_before(pilot) -> None:
        app = pilot.app
        await wait_for(pilot, lambda: app.loaded)
        await pilot.pause()
        if detail is not None:
            app.open_detail(detail)
            await wait_for(pilot, lambda: getattr(app.screen, "detail", None) is not None)
        if keys:
            await pilot.press(*keys)
        app.clear_notifications()
        await pilot.pause(0.2)

    return run_before


def test_overview(workspace, snap_compare):
    path, _ = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=SIZE, run_before=_before())


def test_tree_expanded(workspace, snap_compare):
    path, _ = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=SIZE, run_before=_before("2", "e"))


def test_queue(workspace, snap_compare):
    path, _ = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=SIZE, run_before=_before("3"))


def test_detail_diff_of_the_eligible_candidate(workspace, snap_compare):
    path, ids = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=SIZE,
                        run_before=_before("2", detail=ids["eligible"]))


def test_overview_at_80x24(workspace, snap_compare):
    path, _ = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=(80, 24), run_before=_before())


def test_detail_cells_heatmap_of_a_candidate_over_its_limit(workspace, snap_compare):
    path, ids = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=SIZE,
                        run_before=_before("4", detail=ids["inadmissible"]))


def test_queue_with_the_candidates_heatmap_at_160_columns(workspace, snap_compare):
    path, _ = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=(160, 36), run_before=_before("3"))


def test_progress(workspace, snap_compare):
    path, _ = workspace
    assert snap_compare(make_app(path, poll=False), terminal_size=SIZE, run_before=_before("6"))
