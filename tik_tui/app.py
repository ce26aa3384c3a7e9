"""The TIK terminal UI: steer a search over SSH, approve promotions, browse the history.

The app reads the workspace on one background thread (`StoreClient`), polling `events_since`,
and writes only decisions and worker commands through the store. A search is started as a
separate `tik search --detach` process, never in this one, so closing the UI never stops it.
"""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.reactive import reactive

from tik_tui.config import UiConfig
from tik_tui.messages import Decided, Refreshed
from tik_tui.screens.detail import DetailScreen
from tik_tui.screens.dialogs import ConfirmDialog, GotoDialog, RejectDialog, SearchRequest, StartSearchDialog
from tik_tui.screens.main import MainScreen
from tik_tui.widgets.model import Poller, Snapshot, StoreClient, worker_alive
from tik_tui.widgets.overview import event_line

#: event kinds (from the worker) after which the named candidate is under evaluation; any other
#: event naming it (its `evaluation`, a `status` change) ends that
EVALUATING_KINDS = ("evaluating", "resume_evaluate")
READ_ONLY = "  (read-only: viewing only)"


def _stable(worker: dict | None) -> dict:
    """The worker row without the fields the store recomputes on every read."""
    return {k: v for k, v in (worker or {}).items() if k not in ("heartbeat_age_s", "alive")}


def display_path(path: Path) -> str:
    """The workspace as the user would type it: relative to the current directory when inside it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        try:
            return "~/" + str(path.relative_to(Path.home()))
        except ValueError:
            return str(path)


class DerivationCommands(Provider):
    """Command palette: `#12` or `12` jumps to a derivation; words match operator/status/proposer."""

    async def search(self, query: str) -> Hits:
        app: TikApp = self.app
        matcher = self.matcher(query)
        q = query.strip().lstrip("#")
        impls = app.snapshot.impls
        if q.isdigit() and int(q) in impls:
            row = impls[int(q)]
            yield Hit(1.0, f"Go to #{q}  {row.get('op')} {row.get('status')}", lambda i=int(q): app.open_detail(i),
                      help="open the derivation")
        if len(q) < 2:
            return
        for i in sorted(impls, reverse=True)[:2000]:
            row = impls[i]
            text = f"#{i} {row.get('op')} {row.get('status')} {row.get('proposer')}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), lambda i=i: app.open_detail(i), help="open the derivation")


class TikApp(App):
    """`TikApp(workspace)`; tests pass `opener` (a store factory), `clock` and `search_command`."""

    CSS_PATH = "app.tcss"
    TITLE = "TIK"
    ENABLE_COMMAND_PALETTE = True
    COMMANDS = App.COMMANDS | {DerivationCommands}

    BINDINGS = [
        Binding("f1", "toggle_help", "Help", id="app.help", tooltip="Show or hide the keys of the focused view"),
        Binding("s", "start_search", "Start", id="app.start", tooltip="Start a search (a detached worker)"),
        Binding("p", "pause_resume", "Pause/Resume", id="app.pause", tooltip="Pause or resume the worker"),
        Binding("x", "stop", "Stop", id="app.stop", tooltip="Stop the worker (asks first)"),
        Binding("g", "goto", "Go to #", id="app.goto", tooltip="Open a derivation by id"),
        Binding("ctrl+r", "refresh", "Refresh", show=False, id="app.refresh"),
        Binding("ctrl+t", "toggle_dark", "Light/Dark", show=False, id="app.theme"),
        Binding("q", "quit", "Quit", id="app.quit", tooltip="Quit the UI; a running worker keeps running"),
    ]

    snapshot: reactive[Snapshot] = reactive(Snapshot, init=False, always_update=True)
    """The latest read of the workspace; replaced (never mutated) by each poll that saw a change."""
    loaded: reactive[bool] = reactive(False)
    """True once the first poll has answered."""
    store_error: reactive[str] = reactive("")
    """The last error of the store thread ('' when the last poll succeeded)."""

    def __init__(self, workspace: Path, *, config: UiConfig | None = None,
                 opener: Callable[[Path], object] | None = None, clock: Callable[[], float] = time.time,
                 search_command: list[str] | None = None, poll: bool = True):
        super().__init__()
        self.workspace = Path(workspace)
        self.config = config or UiConfig()
        self.clock = clock
        self.client = StoreClient(self.workspace, opener)
        self.poller = Poller(clock=clock)
        self.evaluating: set[int] = set()
        self.search_command = search_command or [sys.executable, "-m", "tik_tui.cli.main"]
        self._poll_enabled = poll
        self._polling = False
        self.sub_title = display_path(self.workspace)

    # -- lifecycle ------------------------------------------------------------------------
    def on_mount(self) -> None:
        if self.config.theme in self.available_themes:
            self.theme = self.config.theme
        if self.config.keymap:
            self.set_keymap(self.config.keymap)
        self.push_screen(MainScreen())
        if self._poll_enabled:
            self.set_interval(self.config.poll_interval, self.poll)
        self.poll()

    def on_unmount(self) -> None:
        self.client.close()

    # -- polling --------------------------------------------------------------------------
    @work(group="poll", exit_on_error=False)
    async def poll(self) -> None:
        """One poll on the store thread; skipped while the previous one is still running."""
        if self._polling:
            return
        self._polling = True
        try:
            result = await self.client.call(self.poller.poll)
        except Exception as e:
            if str(e) != self.store_error:
                self.notify(f"store: {e}", severity="error", timeout=8)
            self.store_error = str(e)
            return
        finally:
            self._polling = False
        self.store_error = ""
        if self.client.readonly and not self.sub_title.endswith(READ_ONLY):
            self.sub_title += READ_ONLY
        self._track_evaluating(result.events)
        snap = result.snapshot
        if snap is None:
            if _stable(result.worker) == _stable(self.snapshot.worker):
                return
            snap = Snapshot(**{**self.snapshot.__dict__, "worker": result.worker})
        for e in result.events:
            if "error" in str(e.get("kind")) or "crash" in str(e.get("kind")):
                self.notify(event_line(e, self.clock()).plain[:300], title="worker", severity="error", timeout=10)
        self.snapshot = snap
        self.loaded = True
        message = Refreshed(snapshot=snap, events=result.events, evaluating=set(self.evaluating))
        for screen in self.screen_stack:
            screen.post_message(message)

    def _track_evaluating(self, events: list[dict]) -> None:
        for e in events:
            i = e.get("impl_id")
            if i is None:
                continue
            if str(e.get("kind")) in EVALUATING_KINDS:
                self.evaluating.add(int(i))
            else:
                self.evaluating.discard(int(i))

    def action_refresh(self) -> None:
        self.poller._last_full = None
        self.poll()

    # -- navigation -----------------------------------------------------------------------
    def open_detail(self, impl_id: int) -> None:
        self.push_screen(DetailScreen(impl_id))

    def action_goto(self) -> None:
        def _go(impl_id: int | None) -> None:
            if impl_id is None:
                return
            if impl_id not in self.snapshot.impls:
                self.notify(f"no derivation #{impl_id}", severity="warning")
                return
            self.open_detail(impl_id)

        self.push_screen(GotoDialog(), _go)

    def action_toggle_help(self) -> None:
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def action_toggle_dark(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Start a search", "Start a detached worker (operator, proposer, budget)",
                            self.action_start_search)
        yield SystemCommand("Pause or resume the worker", "Send pause/resume through the store",
                            self.action_pause_resume)
        yield SystemCommand("Stop the worker", "Send stop through the store", self.action_stop)
        yield SystemCommand("Go to derivation", "Open a derivation by id", self.action_goto)
        yield SystemCommand("Refresh", "Re-read the whole workspace now", self.action_refresh)

    # -- decisions ------------------------------------------------------------------------
    def writable(self, what: str) -> bool:
        """False (and says why) when this user can only view the workspace."""
        if self.client.readonly:
            self.notify(f"cannot {what}: {self.workspace} is read-only for you (viewing only)", severity="warning")
        return not self.client.readonly

    def approve(self, impl_id: int) -> None:
        if self.writable(f"promote #{impl_id}"):
            self._decide(impl_id, "promote", "")

    def reject(self, impl_id: int) -> None:
        if not self.writable(f"reject #{impl_id}"):
            return
        def _with_reason(reason: str | None) -> None:
            if reason:
                self._decide(impl_id, "reject", reason)

        self.push_screen(RejectDialog(impl_id), _with_reason)

    @work(group="write", exit_on_error=False)
    async def _decide(self, impl_id: int, action: str, reason: str) -> None:
        by = f"tui:{getpass.getuser()}"
        try:
            await self.client.call(lambda ws: ws.decide(impl_id, action, by=by, reason=reason))
        except Exception as e:
            self.notify(f"cannot {action} #{impl_id}: {e}", severity="error", timeout=8)
            return
        self.notify(f"#{impl_id} {'promoted' if action == 'promote' else 'rejected'}", timeout=4)
        for screen in self.screen_stack:
            screen.post_message(Decided(impl_id, action))
        self.action_refresh()

    async def action_quit(self) -> None:
        """Quit the UI; a running worker is a separate process and keeps going, which the shell is told."""
        w = self.snapshot.worker or {}
        if self._worker_alive():
            self.exit(message=f"tik: the worker keeps running (pid {w.get('pid')}, {w.get('state')}): "
                              f"`tik -w {display_path(self.workspace)} status` follows it, `tik stop` stops it")
        else:
            self.exit()

    # -- run control ----------------------------------------------------------------------
    def _worker_alive(self) -> bool:
        return worker_alive(self.snapshot.worker or {}, self.clock())

    def action_start_search(self) -> None:
        if not self.writable("start a search"):
            return
        if self._worker_alive():
            self.notify("a worker is already running: pause (p) or stop (x) it first", severity="warning")
            return
        if not self.snapshot.operators:
            self.notify("no operators in this workspace: run `tik init` first", severity="warning")
            return
        self.push_screen(StartSearchDialog(self.snapshot.op_names), self._start_search)

    def _start_search(self, request: SearchRequest | None) -> None:
        if request is not None:
            # the worker takes a few seconds to start (imports, its first state write): say so at once
            self.notify(f"starting a search: {' '.join(request.argv())}…", timeout=6)
            self.spawn_search(request)

    @work(thread=True, group="spawn", exit_on_error=False)
    def spawn_search(self, request: SearchRequest) -> None:
        """`tik -w WS search --detach ...` as its own process; it forks the worker and returns."""
        argv = [*self.search_command, "-w", str(self.workspace), "search", "--detach", *request.argv()]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.call_from_thread(self.notify, f"cannot start the search: {e}", severity="error", timeout=10)
            return
        if out.returncode != 0:
            lines = (out.stderr or out.stdout or "").strip().splitlines()
            why = lines[-1] if lines else f"exit status {out.returncode}"
            self.call_from_thread(self.notify, f"search did not start: {why}", severity="error", timeout=10)
            return
        self.call_from_thread(self.notify, "search started: a detached worker; it keeps running when you quit (q)",
                              timeout=5)
        self.call_from_thread(self.action_refresh)

    def action_pause_resume(self) -> None:
        state = (self.snapshot.worker or {}).get("state")
        if not self.writable("pause or resume the worker"):
            return
        if not self._worker_alive():
            self.notify("no worker is running (start one with s)", severity="warning")
            return
        self.send_command("resume" if state == "paused" else "pause")

    def action_stop(self) -> None:
        if not self.writable("stop the worker"):
            return
        if not self._worker_alive():
            self.notify("no worker is running", severity="warning")
            return

        def _confirmed(yes: bool | None) -> None:
            if yes:
                self.send_command("stop")

        self.push_screen(ConfirmDialog("Stop the worker after its current step?"), _confirmed)

    @work(group="write", exit_on_error=False)
    async def send_command(self, kind: str) -> None:
        try:
            await self.client.call(lambda ws: ws.send_command(kind))
        except Exception as e:
            self.notify(f"cannot send {kind}: {e}", severity="error", timeout=8)
            return
        self.notify(f"sent {kind} to the worker", timeout=3)
