"""The background worker: one search per workspace, controlled only through the store.

`run_search` takes the workspace lock (`worker.lock`, one worker per workspace), heartbeats
into `worker_state` (a thread keeps it fresh during long evaluations), honours pause /
resume / stop commands and SIGTERM (finishes the evaluation in flight, then stops), and
records a crash as `crashed` with its cause. A worker killed outright (SIGKILL) leaves
`worker_state` at running or paused; the next `run_search` on the workspace takes over that
search: same id, same budget, spending recounted from the store, and any `candidate` left
unevaluated is evaluated first.

With the real evaluator, `run_search` first reaps what dead evaluators left: sandbox processes and scratch
directories whose owner is gone (`tik_kernels.evaluator.sandbox.reap_stale`).

Evaluations run on the executor the options name (`--executor local|ray`, `--workers N`,
`--address ADDR`; `tik_tui.agent.executor`); this process stays the only writer of the store.

`python -m tik_tui.worker -w DIR [search options]` is what `tik search --detach` starts. The agent
is imported inside the functions that run it: `tik` imports this module for `add_search_options`
on every command, `tik log` included.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOCK_NAME = "worker.lock"
HEARTBEAT_S = 2.0
#: tik_kernels.evaluator.sandbox.UNSAFE_ENV (not imported for it: importing tik_kernels loads Triton)
UNSAFE_ENV = "TIK_UNSAFE_NO_SANDBOX"

#: space held back while a search runs, given up on a full disk so the worker can still record why it stopped
RESERVE_NAME = "worker.reserve"
RESERVE_BYTES = 1 << 20


class WorkerBusy(Exception):
    """Another worker holds this workspace."""


class WorkspaceLock:
    """An exclusive flock on `<workspace>/worker.lock`, released when the process dies (even by SIGKILL)."""

    def __init__(self, path: Path):
        self.path = Path(path) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise WorkerBusy(f"a worker is already running on {self.path.parent} (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> WorkspaceLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def worker_busy(path: Path) -> str | None:
    """The busy message when a live worker holds the workspace, else None."""
    try:
        with WorkspaceLock(path):
            return None
    except WorkerBusy as e:
        return str(e)


#: configs the tuner screens at a time on a timed device (`--screen`)
DEFAULT_SCREEN = 12


def _reserve(path: Path) -> None:
    """Hold RESERVE_BYTES of the workspace's disk (written, not sparse) for `_record_crash`."""
    try:
        with open(path / RESERVE_NAME, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
    except OSError:
        (path / RESERVE_NAME).unlink(missing_ok=True)


def crash_reason(e: BaseException, path: Path) -> str:
    """One line saying why the search stopped; a full disk in words (it used to be a traceback)."""
    from tik_store.errors import is_disk_full

    if is_disk_full(e):
        return f"disk full: cannot write {getattr(e, 'filename', None) or path} (free space, then `tik search` " \
               "resumes this search)"
    line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {line}"[:300]


def _record_crash(ws: Any, path: Path, e: BaseException) -> None:
    """State `crashed` with its reason. On a full disk the write itself can fail: give up the reserve and retry,
    so the state never stays `running` for a worker that has stopped."""
    for attempt in range(2):
        try:
            ws.set_worker_state(state="crashed", heartbeat=time.time(), message=crash_reason(e, path))
            return
        except Exception:  # the disk is still full: the reserve is gone, try once more
            if attempt:
                return
            (path / RESERVE_NAME).unlink(missing_ok=True)


def _previous_search(ws: Any, ops: list[str], proposer_label: str) -> dict | None:
    """The search a killed worker left behind, when it was over the same ops with the same proposer."""
    st = ws.worker_state() or {}
    extra = st.get("extra") if isinstance(st.get("extra"), dict) else {}
    st = {**extra, **st}
    if st.get("state") not in ("running", "paused", "crashed") or not st.get("search"):
        return None
    if st.get("proposer") != proposer_label or st.get("ops") != ",".join(ops):
        return None
    return st


def run_search(workspace: Any, ops: list[str] | None = None, proposer: str = "tuner", budget: int | None = 8,
               auto_promote: bool = False, *, evaluate: Callable | None = None, proposer_opts: dict | None = None,
               device: str | None = None, timeout: float = 120.0, max_tokens: int | None = None,
               max_cost_usd: float | None = None, max_wall_s: float | None = None, patience: int | None = None,
               evidence: bool = True, explore: bool = True, seed: int = 0,
               on_event: Callable[[str, dict], None] | None = None, resume: bool = True, executor: str = "local",
               address: str | None = None, workers: int | None = None, time_it: bool | None = None,
               screen: int | None = None) -> dict:
    """Run the loop to its end in this process; returns the search summary (with `state` and `resumed`).

    `screen`: the tuner's screen width (`SearchConfig.screen`); default DEFAULT_SCREEN with the real
    evaluator, off with an injected one (its timings are not the screen's).

    `executor`, `address`, `workers`: where evaluations run (`tik_tui.agent.executor.make_executor`);
    raises `ExecutorError` (a ValueError, one line) for a bad choice or an unreachable cluster."""
    from tik_store import Workspace
    from tik_tui.agent import default_proposer, make_proposer
    from tik_tui.agent.executor import make_executor
    from tik_tui.agent.loop import Search, SearchConfig

    path = Path(workspace.path if hasattr(workspace, "path") else workspace)
    lock = WorkspaceLock(path)
    lock.acquire()
    _reserve(path)
    ws = Workspace.open(path)
    stop_flag = threading.Event()
    old_handlers = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame):
            # the first signal stops after the step in flight; a second Ctrl-C interrupts at once
            if signum == signal.SIGINT and stop_flag.is_set():
                raise KeyboardInterrupt
            stop_flag.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, on_signal)
    beat_stop = threading.Event()
    pool = None
    try:
        all_ops = [r["op"] for r in ws.operators()]
        ops = list(ops or all_ops)
        unknown = [o for o in ops if o not in all_ops]
        if unknown:
            raise ValueError(f"operator(s) not in the workspace: {', '.join(unknown)}")
        prop = make_proposer(proposer or default_proposer(), **(proposer_opts or {}))
        label = getattr(prop, "label", None) or prop.name
        prev = _previous_search(ws, ops, label) if resume else None
        cfg = SearchConfig(ops=ops, budget=budget, max_tokens=max_tokens, max_cost_usd=max_cost_usd,
                           max_wall_s=max_wall_s, patience=patience, auto_promote=auto_promote, device=device,
                           timeout=timeout, evidence=evidence, explore=explore, seed=seed, time_it=time_it,
                           screen=(DEFAULT_SCREEN if evaluate is None else 0) if screen is None else screen)
        pool = make_executor(executor, address=address, workers=workers, device=device, evaluate=evaluate)
        search = Search(ws, prop, cfg, evaluate=evaluate, search_id=prev["search"] if prev else None,
                        on_event=on_event, should_stop=stop_flag.is_set, executor=pool)
        if evaluate is None:
            # a killed worker's (or `tik check`'s) sandbox leftovers: none should live, the scratch stays on disk
            from tik_kernels.evaluator.sandbox import reap_stale

            killed, removed = reap_stale()
            if killed or removed:
                search.emit("sandbox_reaped", {"processes": killed, "directories": removed})
        if prev:
            search.state.started = float(prev.get("started") or search.state.started)
            search.state.tokens = int(prev.get("tokens") or 0)
            search.state.cost_usd = float(prev.get("cost_usd") or 0.0)
            search.emit("search_resumed", {"previous_pid": prev.get("pid")})
        ws.set_worker_state(pid=os.getpid(), state="running", proposer=label, op=",".join(ops), ops=",".join(ops),
                            budget=budget, executor=pool.describe(),
                            heartbeat=time.time(), message="starting")

        def beat() -> None:
            from tik_store.channel import Channel

            try:
                # the control channel alone: no git repository, no repair pass in this thread
                with Channel.open(path) as channel:
                    while not beat_stop.wait(HEARTBEAT_S):
                        channel.set_worker_state(heartbeat=time.time())
            except Exception:  # a full disk: the search's own write reports it
                return

        threading.Thread(target=beat, name="tik-heartbeat", daemon=True).start()
        try:
            summary = search.run()
        except Exception as e:
            beat_stop.set()
            _record_crash(ws, path, e)
            raise
        summary["resumed"] = bool(prev)
        return summary
    finally:
        beat_stop.set()
        if pool is not None:
            pool.close()
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
        ws.close() if hasattr(ws, "close") else None
        (path / RESERVE_NAME).unlink(missing_ok=True)
        lock.release()


# ----------------------------------------------------------------------------- command line


def add_search_options(p: argparse.ArgumentParser) -> None:
    from tik_tui.cli.common import nonneg_int, positive_float, positive_int

    p.add_argument("--op", action="append", dest="ops", metavar="OP", help="operator to optimize (repeatable; "
                   "default: all)")
    p.add_argument("--proposer", default=None, help="claude | tuner | replay:FILE (default: claude when "
                   "ANTHROPIC_API_KEY is set, else tuner)")
    p.add_argument("--budget", type=positive_int, default=8, help="derivations to make, failures included (default 8)")
    p.add_argument("--auto-promote", action="store_true", help="promote eligible candidates without asking")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="where candidates are evaluated")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="seconds per evaluation (hard kill)")
    p.add_argument("--time", action="store_true",
                   help="time candidates on the CPU too (Triton-interpreter wall times, compared only within this "
                        "run), so a CPU search can reach eligible candidates; on a GPU they are always timed")
    p.add_argument("--screen", type=nonneg_int, default=None, metavar="N",
                   help=f"tuner: time N untried configs together (successive halving) before evaluating the "
                        f"best one, where candidates are timed (default {DEFAULT_SCREEN}; 0: off)")
    p.add_argument("--max-tokens", type=positive_int, default=None, help="stop after this many LLM tokens")
    p.add_argument("--max-cost", type=positive_float, default=None, help="stop after this many US dollars of LLM use")
    p.add_argument("--max-time", type=positive_float, default=None, help="stop after this many seconds")
    p.add_argument("--patience", type=positive_int, default=None, help="stop after N derivations with no eligible one")
    p.add_argument("--model", default=None, help="Claude model (default $TIK_MODEL, else claude-sonnet-5-5)")
    p.add_argument("--thinking", default=None, metavar="adaptive|off|N",
                   help="claude: thinking mode where the model takes it (default: the model's own)")
    p.add_argument("--effort", default=None, metavar="LEVEL",
                   help="claude: output effort (low, medium, high, xhigh, max) where the model takes it")
    p.add_argument("--record", default=None, metavar="FILE",
                   help="claude: append every API request and response to FILE as JSON lines (never the key)")
    p.add_argument("--no-evidence", action="store_true", help="ablation: hide failed attempts and opportunities")
    p.add_argument("--greedy", action="store_true", help="ablation: always expand the incumbent (no branches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fresh", action="store_true", help="start a new search instead of resuming a killed one")
    p.add_argument("--executor", default="local", metavar="local|ray",
                   help="where evaluations run: local (this machine; default) or ray (a Ray cluster, see --address)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="the Ray cluster's head, host:port or ray://host:port (default $RAY_ADDRESS); --executor ray")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="evaluations in flight (default: one per visible GPU, 1 on the CPU; with ray: the "
                   "cluster's GPUs); more than the GPUs: several evaluator processes a GPU, taking turns to time")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="evaluate candidates in plain child processes where the kernel refuses the sandbox's "
                        "namespaces (a candidate can then read and write whatever this user can)")
    p.add_argument("--evaluator", default=None, help=argparse.SUPPRESS)


def sandbox_choice(args: argparse.Namespace) -> str | None:
    """--unsafe-no-sandbox: exported to the environment, so every evaluator process of this search (pool slots,
    a detached worker's children) runs candidates unconfined. Otherwise the one-line refusal where the sandbox
    cannot start (None where it can, or where an injected evaluator runs no candidate code)."""
    if args.unsafe_no_sandbox:
        os.environ[UNSAFE_ENV] = "1"
        return None
    if args.evaluator:
        return None
    from tik_kernels.evaluator.sandbox import required

    return required()


def search_kwargs(args: argparse.Namespace) -> dict:
    from tik_tui.agent import default_proposer
    from tik_tui.agent.jobs import load_evaluator

    return dict(ops=args.ops, proposer=args.proposer or default_proposer(), budget=args.budget,
                auto_promote=args.auto_promote, device=args.device, timeout=args.timeout,
                max_tokens=args.max_tokens, max_cost_usd=args.max_cost, max_wall_s=args.max_time,
                patience=args.patience, evidence=not args.no_evidence, explore=not args.greedy, seed=args.seed,
                resume=not args.fresh, time_it=True if args.time else None,
                proposer_opts={"model": args.model, "seed": args.seed, "thinking": args.thinking,
                               "effort": args.effort, "record": args.record},
                evaluate=load_evaluator(args.evaluator) if args.evaluator else None, executor=args.executor,
                address=args.address, workers=args.workers, screen=args.screen)


def search_argv(args: argparse.Namespace) -> list[str]:
    """The worker command line reproducing `args` (for --detach); never carries a key."""
    from tik_tui.agent import default_proposer

    argv = []
    for op in args.ops or ():
        argv += ["--op", op]
    for flag, val in (("--proposer", args.proposer or default_proposer()), ("--budget", args.budget),
                      ("--device", args.device), ("--timeout", args.timeout), ("--max-tokens", args.max_tokens),
                      ("--max-cost", args.max_cost), ("--max-time", args.max_time), ("--patience", args.patience),
                      ("--model", args.model), ("--thinking", args.thinking), ("--effort", args.effort),
                      ("--record", args.record and str(Path(args.record).resolve())), ("--seed", args.seed),
                      ("--evaluator", args.evaluator),
                      ("--executor", args.executor), ("--address", args.address), ("--workers", args.workers),
                      ("--screen", args.screen)):
        if val is not None:
            argv += [flag, str(val)]
    for flag, on in (("--auto-promote", args.auto_promote), ("--no-evidence", args.no_evidence),
                     ("--greedy", args.greedy), ("--fresh", args.fresh), ("--time", args.time),
                     ("--unsafe-no-sandbox", args.unsafe_no_sandbox)):
        if on:
            argv.append(flag)
    return argv


def main(argv: list[str] | None = None) -> int:
    from tik_tui.agent.executor import ExecutorError

    p = argparse.ArgumentParser(prog="tik-worker", description="the TIK search worker (started by tik search "
                                "--detach)")
    p.add_argument("-w", "--workspace", type=Path, required=True)
    add_search_options(p)
    args = p.parse_args(argv)
    refused = sandbox_choice(args)
    if refused:
        print(f"tik-worker: error: {refused}", file=sys.stderr)
        return 2
    try:
        summary = run_search(args.workspace, **search_kwargs(args))
    except WorkerBusy as e:
        print(f"tik-worker: {e}", file=sys.stderr)
        return 3
    except ExecutorError as e:
        print(f"tik-worker: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from tik_store.errors import WorkspaceError, is_disk_full

        if not (is_disk_full(e) or isinstance(e, WorkspaceError)):
            raise
        # recorded in the worker's state already; the log gets the same line, not a traceback
        print(f"tik-worker: error: {crash_reason(e, args.workspace)}", file=sys.stderr)
        return 1
    print(f"tik-worker: {summary['state']}: {summary['stop_reason']} ({summary['spent']} derivations)",
          file=sys.stderr)
    return 0 if summary["state"] != "crashed" else 1


if __name__ == "__main__":
    sys.exit(main())
