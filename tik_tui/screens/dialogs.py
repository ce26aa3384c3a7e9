"""Modal dialogs: a reason for a rejection, a confirmation, a derivation id, a new search."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select


class _Dialog(ModalScreen):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)


class RejectDialog(_Dialog):
    """Asks why; dismisses with the reason, or None when cancelled. An empty reason is refused."""

    def __init__(self, impl_id: int):
        super().__init__()
        self.impl_id = impl_id

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"Reject #{self.impl_id}: why? (enter to reject, escape to cancel)")
            yield Input(placeholder="reason, e.g. 'regresses decode on H100'", id="reason")
            yield Label("", id="reject-error", classes="error")

    @on(Input.Submitted, "#reason")
    def _submit(self, event: Input.Submitted) -> None:
        reason = event.value.strip()
        if not reason:
            self.query_one("#reject-error", Label).update("a rejection needs a reason")
            return
        self.dismiss(reason)


class ConfirmDialog(_Dialog):
    """y / enter confirms, n / escape cancels."""

    BINDINGS = [
        Binding("y,enter", "confirm", "Yes", id="dialog.yes"),
        Binding("n,escape", "cancel", "No", id="dialog.no"),
    ]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Label("[b]y[/b] yes   [b]n[/b] no", classes="hint")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class GotoDialog(_Dialog):
    """Dismisses with a derivation id (int) or None."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Go to derivation (id):")
            yield Input(placeholder="12", id="goto", type="integer")

    @on(Input.Submitted, "#goto")
    def _submit(self, event: Input.Submitted) -> None:
        value = event.value.strip().lstrip("#")
        self.dismiss(int(value) if value.isdigit() else None)


@dataclass(frozen=True)
class SearchRequest:
    op: str | None
    proposer: str
    budget: int
    auto_promote: bool

    def argv(self) -> list[str]:
        """The arguments after `tik -w WS search --detach`."""
        # --time: a search started here on a CPU machine times its candidates in the interpreter, so it can
        # reach a promotion to approve; on a GPU candidates are timed anyway
        out = ["--proposer", self.proposer, "--budget", str(self.budget), "--time"]
        if self.op:
            out = ["--op", self.op, *out]
        if self.auto_promote:
            out.append("--auto-promote")
        return out


class StartSearchDialog(_Dialog):
    """Operator, proposer, budget; dismisses with a `SearchRequest` or None."""

    def __init__(self, ops: list[str], default_op: str | None = None):
        super().__init__()
        self.ops = ops
        self.default_op = default_op

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("[b]Start a search[/b] (a detached worker process; tab moves, enter starts)")
            with Horizontal(classes="field"):
                yield Label("operator ", classes="field-label")
                yield Select([("all operators", "")] + [(o, o) for o in self.ops],
                             value=self.default_op or "", allow_blank=False, id="op")
            with Horizontal(classes="field"):
                yield Label("proposer ", classes="field-label")
                yield Select([("tuner (offline)", "tuner"), ("claude (API)", "claude"), ("replay FILE", "replay")],
                             value="tuner", allow_blank=False, id="proposer")
            with Horizontal(classes="field"):
                yield Label("replay ", classes="field-label")
                yield Input(placeholder="FILE for replay", id="replay-file")
            with Horizontal(classes="field"):
                yield Label("budget ", classes="field-label")
                yield Input("10", type="integer", id="budget")
            yield Checkbox("auto-promote eligible candidates", id="auto-promote")
            yield Label("", id="search-error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Start", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def request(self) -> SearchRequest | str:
        """The request, or why it cannot be made."""
        budget = self.query_one("#budget", Input).value.strip()
        if not budget.isdigit() or int(budget) < 1:
            return "budget must be a positive whole number"
        proposer = self.query_one("#proposer", Select).value
        if proposer == "replay":
            path = self.query_one("#replay-file", Input).value.strip()
            if not path:
                return "replay needs a FILE of recorded responses"
            proposer = f"replay:{path}"
        op = self.query_one("#op", Select).value or None
        return SearchRequest(op=op, proposer=str(proposer), budget=int(budget),
                             auto_promote=self.query_one("#auto-promote", Checkbox).value)

    def _start(self) -> None:
        req = self.request()
        if isinstance(req, str):
            self.query_one("#search-error", Label).update(req)
            return
        self.dismiss(req)

    @on(Button.Pressed, "#start")
    def _pressed_start(self) -> None:
        self._start()

    @on(Button.Pressed, "#cancel")
    def _pressed_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self._start()
