"""The main screen: overview, derivation tree, promotion queue (with the highlighted candidate's cell heatmap),
history, events, and progress (time ×root of every derivation per operator) — one tab each."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Static, TabbedContent, TabPane, Tree

from tik_tui.messages import Refreshed
from tik_tui.widgets.derivation_tree import DerivationTree
from tik_tui.widgets.heatmap import cell_maps
from tik_tui.widgets.history import HistoryTable
from tik_tui.widgets.keyed_table import KeyedTable
from tik_tui.widgets.model import Snapshot
from tik_tui.widgets.overview import EventLog, OperatorsTable, WorkerPanel
from tik_tui.widgets.progress_chart import charts
from tik_tui.widgets.queue import QueueTable

EMPTY_WORKSPACE = (
    "This workspace has no operators yet.\n"
    "Seed it with the library's root implementations:  tik init  (or `tik -w DIR init`),\n"
    "then start a search here with [b]s[/b], or from a shell:  tik search --proposer tuner --detach"
)

EMPTY_QUEUE = "No candidate waits for a decision. Eligible candidates (verified, admissible, faster than the " \
              "incumbent) appear here; approve with [b]a[/b], reject with [b]r[/b]."


class QueueView(QueueTable):
    """The queue table with its decision keys: they exist only here, and only with a row selected."""

    BINDINGS = [
        Binding("a", "approve", "Approve", id="queue.approve", tooltip="Promote the selected candidate"),
        Binding("r", "reject", "Reject", id="queue.reject", tooltip="Reject the selected candidate (asks why)"),
        Binding("c", "compare", "Compare", id="queue.compare", tooltip="Candidate vs incumbent"),
    ]

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("approve", "reject", "compare"):
            return self.selected_key is not None
        return True

    def action_approve(self) -> None:
        if self.selected_key is not None:
            self.app.approve(int(self.selected_key))

    def action_reject(self) -> None:
        if self.selected_key is not None:
            self.app.reject(int(self.selected_key))

    def action_compare(self) -> None:
        if self.selected_key is not None:
            from tik_tui.screens.detail import CompareScreen

            self.app.push_screen(CompareScreen(int(self.selected_key)))


class MainScreen(Screen):
    BINDINGS = [
        Binding("1", "tab('overview')", "Overview", show=False, id="main.overview"),
        Binding("2", "tab('tree')", "Tree", show=False, id="main.tree"),
        Binding("3", "tab('queue')", "Queue", show=False, id="main.queue"),
        Binding("4", "tab('history')", "History", show=False, id="main.history"),
        Binding("5", "tab('events')", "Events", show=False, id="main.events"),
        Binding("6", "tab('progress')", "Progress", show=False, id="main.progress"),
        Binding("slash", "focus_filter", "Find", show=False, id="main.find", tooltip="Filter the history"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="overview"):
            with TabPane("1 Overview", id="overview"):
                yield Static(EMPTY_WORKSPACE, id="empty-workspace", classes="empty")
                yield OperatorsTable(id="operators")
                yield WorkerPanel(id="worker")
                yield EventLog(id="recent-events")
            with TabPane("2 Tree", id="tree"):
                yield DerivationTree(id="derivations")
            with TabPane("3 Queue", id="queue"):
                yield Static(EMPTY_QUEUE, id="empty-queue", classes="empty")
                yield QueueView(id="queue-table")
                with VerticalScroll(id="queue-map-scroll"):
                    yield Static("", id="queue-map")
            with TabPane("4 History", id="history"):
                with Vertical():
                    yield Input(placeholder="/ filter: words match id, operator, status, proposer, rationale",
                                id="history-filter")
                    yield HistoryTable(id="history-table")
                    yield Static("", id="history-count", classes="count")
            with TabPane("5 Events", id="events"):
                yield EventLog(id="all-events")
            with TabPane("6 Progress", id="progress"):
                with VerticalScroll(id="progress-scroll"):
                    yield Static("", id="progress-charts")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#empty-workspace").display = False
        self.query_one("#empty-queue").display = False

    # -- data -------------------------------------------------------------------------------
    @on(Refreshed)
    def _refreshed(self, message: Refreshed) -> None:
        now = self.app.clock()
        snap: Snapshot = message.snapshot
        self.query_one("#empty-workspace").display = not snap.operators
        self.query_one(OperatorsTable).update_from(snap)
        self.query_one(WorkerPanel).update_from(snap, now)
        self.query_one(DerivationTree).update_from(snap, message.evaluating)
        self.query_one(QueueView).update_from(snap)
        self.query_one("#empty-queue").display = not snap.queue
        self.query_one(QueueView).display = bool(snap.queue)
        self.query_one("#queue-map-scroll").display = bool(snap.queue)
        self._show_queue_map()
        history = self.query_one(HistoryTable)
        history.now = now
        if self.query_one(TabbedContent).active == "progress":
            self._update_progress(snap)
        if self.query_one(TabbedContent).active == "history":
            self._update_history(snap)
        else:
            history.snap = snap  # filled in when its tab opens
        if message.events:
            self.query_one("#recent-events", EventLog).add_events(message.events, now, snap.ratios)
            self.query_one("#all-events", EventLog).add_events(message.events, now, snap.ratios)
        queue_tab = self.query_one(TabbedContent).get_tab("queue")
        queue_tab.label = Text.assemble("3 Queue", (f" ({len(snap.queue)})", "bold magenta") if snap.queue else "")

    def _show_queue_map(self) -> None:
        """The highlighted candidate's cells as a heatmap under the queue."""
        key = self.query_one(QueueView).selected_key
        row = next((q for q in self.app.snapshot.queue if str(q["id"]) == key), None)
        body = Text("select a candidate to see its cells", style="dim") if row is None else (
            Text(f"#{row['id']} {row.get('op')}: ", style="bold").append_text(
                cell_maps(row.get("cells") or [], width=max(60, self.size.width - 4))))
        self.query_one("#queue-map", Static).update(body)

    @on(KeyedTable.RowHighlighted, "#queue-table")
    def _queue_highlighted(self) -> None:
        self._show_queue_map()

    def _update_history(self, snap: Snapshot | None = None) -> None:
        history = self.query_one(HistoryTable)
        history.update_from(snap or history.snap)
        shown, matching, total = history.shown
        more = f" (newest {shown}; type a filter to narrow)" if matching > shown else ""
        self.query_one("#history-count", Static).update(f"{matching} of {total} derivations{more}")

    def _update_progress(self, snap: Snapshot | None = None) -> None:
        self.query_one("#progress-charts", Static).update(
            charts(snap or self.app.snapshot, width=max(40, self.size.width - 4)))

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "history":
            self._update_history()
        if event.pane.id == "progress":
            self._update_progress()

    # -- navigation -------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        target = {"overview": OperatorsTable, "tree": DerivationTree, "queue": QueueView,
                  "history": HistoryTable, "events": "#all-events", "progress": "#progress-scroll"}[tab]
        widget = self.query_one(target)
        if widget.display:
            widget.focus()

    def action_focus_filter(self) -> None:
        self.action_tab("history")
        self.query_one("#history-filter", Input).focus()

    @on(Input.Changed, "#history-filter")
    def _filter(self, event: Input.Changed) -> None:
        self.query_one(HistoryTable).set_filter(text=event.value)

    @on(HistoryTable.Filtered)
    def _filtered(self) -> None:
        self._update_history()

    @on(Input.Submitted, "#history-filter")
    def _filter_done(self) -> None:
        self.query_one(HistoryTable).focus()

    @on(KeyedTable.RowSelected)
    def _open_row(self, event: KeyedTable.RowSelected) -> None:
        key = event.row_key.value
        if isinstance(event.data_table, OperatorsTable):
            self.action_tab("tree")
            tree = self.query_one(DerivationTree)
            node = tree._op_nodes.get(key)
            if node is not None:
                node.expand()
                tree.move_cursor(node)
            return
        self.app.open_detail(int(key))

    @on(Tree.NodeSelected)
    def _open_node(self, event: Tree.NodeSelected) -> None:
        if isinstance(event.node.data, int):
            self.app.open_detail(event.node.data)
        else:
            event.node.toggle()
