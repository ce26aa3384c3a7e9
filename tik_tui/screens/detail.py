"""One derivation: source, diff to its parent, checks, latency per cell, rationale and cost.
Reloaded (on the store thread) whenever an event names it, so a candidate under evaluation fills in live."""

from __future__ import annotations

import json

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

from tik_tui.agent.pricing import unpriced_use
from tik_tui.messages import Refreshed
from tik_tui.verdict import explain, objective_ratio
from tik_tui.widgets import format as fmt
from tik_tui.widgets.heatmap import cell_maps
from tik_tui.widgets.model import load_compare, load_detail, parent_of, worst_cell

TABS = ("source", "diff", "checks", "cells", "info")


def _json(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def checks_rows(checks: list[dict]):
    for c in checks:
        passed = bool(c.get("passed"))
        md = c.get("max_diff")
        yield (
            Text("pass", style="bold green") if passed else Text("FAIL", style="bold red"),
            fmt.name_text(c.get("name")),
            "—" if md is None else f"{float(md):.3g}",
            Text(str(c.get("detail") or ""), style="" if passed else "red"),
        )


def cell_rows(cells: list[dict]):
    for c in cells:
        limit = c.get("limit")
        med, root, inc = c.get("median_us"), c.get("root_median_us"), c.get("incumbent_median_us")
        r_root = c.get("ratio_vs_root")
        if r_root is None and med is not None and root:
            r_root = med / root
        r_inc = med / inc if med is not None and inc else None
        yield (
            fmt.name_text(c.get("cell")),
            f"{float(c.get('coeff') or 1.0):g}",
            fmt.us_text(med),
            fmt.us_text(root),
            fmt.ratio_text(r_root, limit=0.05 if limit is None else float(limit)),
            fmt.us_text(inc),
            fmt.ratio_text(r_inc),
            "—" if limit is None else f"{1 + float(limit):.2f}×",
        )


CELL_COLUMNS = ("cell", "c", "median µs", "root µs", "×root", "incumb. µs", "×inc", "limit ×root")


class DetailScreen(Screen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back", id="detail.back"),
        Binding("a", "approve", "Approve", id="detail.approve", tooltip="Promote this eligible candidate"),
        Binding("r", "reject", "Reject", id="detail.reject", tooltip="Reject this candidate (asks for a reason)"),
        Binding("u", "parent", "Parent", id="detail.parent", tooltip="Open the parent derivation"),
        Binding("c", "compare", "Compare", id="detail.compare", tooltip="Compare with the incumbent"),
        Binding("1", "tab('source')", "Source", show=False, id="detail.source"),
        Binding("2", "tab('diff')", "Diff", show=False, id="detail.diff"),
        Binding("3", "tab('checks')", "Checks", show=False, id="detail.checks"),
        Binding("4", "tab('cells')", "Cells", show=False, id="detail.cells"),
        Binding("5", "tab('info')", "Info", show=False, id="detail.info"),
    ]

    def __init__(self, impl_id: int):
        super().__init__()
        self.impl_id = impl_id
        self.detail: dict | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"#{self.impl_id} loading…", id="detail-head")
        with TabbedContent(initial="source"):
            with TabPane("1 Source", id="source"):
                with VerticalScroll():
                    yield Static("", id="source-body")
            with TabPane("2 Diff", id="diff"):
                with VerticalScroll():
                    yield Static("", id="diff-body")
            with TabPane("3 Checks", id="checks"):
                yield DataTable(id="checks-table", cursor_type="row")
            with TabPane("4 Cells", id="cells"):
                with VerticalScroll():
                    yield Static("", id="cells-map")
                    yield DataTable(id="cells-table", cursor_type="row")
            with TabPane("5 Info", id="info"):
                with VerticalScroll():
                    yield Static("", id="info-body")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#checks-table", DataTable).add_columns("", "check", "max diff", "detail")
        self.query_one("#cells-table", DataTable).add_columns(*CELL_COLUMNS)
        self.load()

    @work(exclusive=True, group="detail", exit_on_error=False)
    async def load(self) -> None:
        try:
            detail = await self.app.client.call(load_detail, self.impl_id)
        except KeyError:
            self.query_one("#detail-head", Static).update(Text(f"no derivation #{self.impl_id}", style="red"))
            return
        except Exception as e:  # a store error is shown, never a crash of the UI
            self.query_one("#detail-head", Static).update(Text(f"cannot read #{self.impl_id}: {e}", style="red"))
            return
        self.detail = detail
        self.refresh_bindings()  # approve/reject/parent depend on what was loaded: the footer must say so
        self.show(detail)

    @on(Refreshed)
    def _refreshed(self, message: Refreshed) -> None:
        if any(e.get("impl_id") == self.impl_id for e in message.events):
            self.load()

    def show(self, d: dict) -> None:
        impl = d["impl"]
        status = impl.get("status") or "?"
        if status == "candidate" and self.impl_id in getattr(self.app, "evaluating", set()):
            status = "evaluating"
        head = Text.assemble((f"#{self.impl_id} ", "bold"), (f"{impl.get('op')}  ", "bold"),
                             fmt.status_text(status))
        p = parent_of(impl)
        head.append(f"  parent #{p}" if p is not None else "  (root)")
        head.append(f"  {impl.get('proposer') or ''}", style="dim")
        numbers = Text()
        if d["incumbent_id"] == self.impl_id:
            head.append("  [incumbent]", style="bold green")
        if d["root_id"] == self.impl_id:
            head.append("  [root]", style="bold blue")
        worst, wr = worst_cell(d["cells"])
        ratio = self.app.snapshot.ratios.get(self.impl_id) if getattr(self.app, "snapshot", None) else None
        if ratio is not None:
            numbers.append("time ").append_text(fmt.ratio_text(ratio, ref="root"))
        if objective_ratio(impl) is not None:
            numbers.append(", ").append_text(fmt.ratio_text(objective_ratio(impl), ref="incumbent"))
        why = explain(impl, d["cells"])
        if worst is not None and worst not in why:
            lim = next((c.get("limit") for c in d["cells"] if str(c.get("cell")) == worst), None)
            numbers.append(f"; worst cell {worst} ").append_text(
                fmt.ratio_text(wr, limit=None if lim is None else float(lim), ref="root"))
        if numbers:
            head.append("\n").append_text(numbers)
        if why != status:
            style = {"failed": "red", "eligible": "bold magenta", "promoted": "green"}.get(impl.get("status"), "yellow")
            head.append("\n").append(why, style=style)
        self.query_one("#detail-head", Static).update(head)
        self.query_one("#source-body", Static).update(
            Syntax(d["source"] or "", "python", line_numbers=True, word_wrap=False, theme=self._syntax_theme()))
        diff = d["diff"]
        self.query_one("#diff-body", Static).update(
            Syntax(diff, "diff", theme=self._syntax_theme()) if diff
            else Text("the root: no parent to diff against" if p is None else "no change", style="dim"))
        checks = self.query_one("#checks-table", DataTable)
        checks.clear()
        for row in checks_rows(d["checks"]):
            checks.add_row(*row)
        if not d["checks"]:
            checks.add_row("", Text("not evaluated yet", style="dim"), "", "")
        self.query_one("#cells-map", Static).update(
            cell_maps(d["cells"], width=max(60, self.size.width - 4)) if d["cells"]
            else Text("no timings: not evaluated on a timed device yet", style="dim"))
        cells = self.query_one("#cells-table", DataTable)
        cells.clear()
        for row in cell_rows(d["cells"]):
            cells.add_row(*row)
        self.query_one("#info-body", Static).update(self._info(d))

    def _syntax_theme(self) -> str:
        return "monokai" if self.app.current_theme.dark else "default"

    def _info(self, d: dict):
        impl = d["impl"]
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()
        t.add_row("rationale", impl.get("rationale") or Text("—", style="dim"))
        mod = _json(impl.get("modification")) or {}
        if isinstance(mod, dict):
            for key in ("expected_effect", "mechanism", "numerical_risks", "functions_changed",
                        "lines_added", "lines_removed"):
                if mod.get(key) not in (None, "", []):
                    v = mod[key]
                    t.add_row(key.replace("_", " "), ", ".join(map(str, v)) if isinstance(v, list) else str(v))
            for k, v in (_json(mod.get("extra")) or {}).items():
                t.add_row(str(k), str(v))
        usage = _json(impl.get("usage")) or {}
        if isinstance(usage, dict) and usage:
            toks = " ".join(f"{k.replace('_tokens', '')} {fmt.tokens(v)}" for k, v in usage.items()
                            if k.endswith("_tokens") and v)
            t.add_row("tokens", toks or "0")
            model = mod.get("model") or (_json(mod.get("extra")) or {}).get("model") if isinstance(mod, dict) else None
            if model and unpriced_use({model: usage}):
                t.add_row("cost", Text(f"unknown ({model} has no price)", style="yellow"))
            elif usage.get("cost_usd") is not None:
                t.add_row("cost", fmt.money(usage.get("cost_usd")))
        else:
            t.add_row("tokens", Text("none (offline proposer)", style="dim"))
        t.add_row("recorded", str(impl.get("created") or "—"))
        t.add_row("lineage", " → ".join(f"#{i}" for i in d["lineage"]) or "—")
        t.add_row("children", ", ".join(f"#{i}" for i in d["children"]) or "—")
        for dec in d["decisions"]:
            t.add_row("decision", f"{dec.get('action')} by {dec.get('by')} {dec.get('created') or ''} "
                                  f"{dec.get('reason') or ''}".strip())
        return Group(t)

    # -- actions --------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("approve", "reject"):
            return self.detail is not None and self.detail["impl"].get("status") == "eligible"
        if action == "parent":
            return self.detail is not None and parent_of(self.detail["impl"]) is not None
        return True

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_approve(self) -> None:
        self.app.approve(self.impl_id)

    def action_reject(self) -> None:
        self.app.reject(self.impl_id)

    def action_parent(self) -> None:
        p = parent_of(self.detail["impl"]) if self.detail else None
        if p is not None:
            self.app.switch_screen(DetailScreen(p))

    def action_compare(self) -> None:
        self.app.push_screen(CompareScreen(self.impl_id))


class CompareScreen(Screen):
    """A candidate against its operator's incumbent: cell by cell, and the diff between them."""

    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back", id="compare.back"),
        Binding("a", "approve", "Approve", id="compare.approve"),
        Binding("r", "reject", "Reject", id="compare.reject"),
    ]

    def __init__(self, impl_id: int):
        super().__init__()
        self.impl_id = impl_id
        self.data: dict | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"#{self.impl_id} vs incumbent: loading…", id="compare-head")
        yield DataTable(id="compare-table", cursor_type="row")
        with VerticalScroll(id="compare-diff"):
            yield Static("", id="compare-diff-body")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#compare-table", DataTable).add_columns(
            "cell", "candidate µs", "incumbent µs", "×incumbent", "root µs", "×root")
        self.load()

    @work(exclusive=True, group="compare", exit_on_error=False)
    async def load(self) -> None:
        try:
            self.data = data = await self.app.client.call(load_compare, self.impl_id)
        except Exception as e:
            self.query_one("#compare-head", Static).update(Text(f"cannot compare #{self.impl_id}: {e}", style="red"))
            return
        self.refresh_bindings()
        inc = data["incumbent"] or {}
        head = Text.assemble((f"#{self.impl_id}", "bold"), " vs ", (f"#{inc.get('id', '—')}", "bold green"),
                             f"  {data['impl'].get('op')}  ")
        head.append_text(fmt.status_text(data["impl"].get("status") or ""))
        self.query_one("#compare-head", Static).update(head)
        table = self.query_one("#compare-table", DataTable)
        table.clear()
        incumbent_cells = {str(c.get("cell")): c for c in data["incumbent_cells"]}
        for c in data["cells"]:
            med = c.get("median_us")
            inc_med = c.get("incumbent_median_us")
            if inc_med is None:
                inc_med = (incumbent_cells.get(str(c.get("cell"))) or {}).get("median_us")
            root = c.get("root_median_us")
            limit = c.get("limit")
            table.add_row(fmt.name_text(c.get("cell")), fmt.us_text(med), fmt.us_text(inc_med),
                          fmt.ratio_text(med / inc_med if med is not None and inc_med else None),
                          fmt.us_text(root),
                          fmt.ratio_text(med / root if med is not None and root else None,
                                         limit=0.05 if limit is None else float(limit)))
        diff = data["diff"]
        self.query_one("#compare-diff-body", Static).update(
            Syntax(diff, "diff") if diff else Text("same source as the incumbent", style="dim"))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("approve", "reject"):
            return self.data is not None and self.data["impl"].get("status") == "eligible"
        return True

    def action_approve(self) -> None:
        self.app.approve(self.impl_id)

    def action_reject(self) -> None:
        self.app.reject(self.impl_id)
