"""`tik search`, `tik pause`, `tik resume`, `tik stop`, `tik export`: the agent from the command line."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from tik_tui.cli.common import TikError, common_parent, impl_id, nonneg_float, print_json

EXPORTABLE = ("verified", "eligible", "promoted")


def register(sub: argparse._SubParsersAction) -> None:
    from tik_tui.worker import add_search_options

    p = sub.add_parser("search", parents=[common_parent()], help="run the agent loop (foreground, or --detach)")
    add_search_options(p)
    p.add_argument("--detach", action="store_true", help="run as a background worker that outlives the terminal")
    p.set_defaults(func=cmd_search)

    for kind, text in (("pause", "pause the running worker after its current step"),
                       ("resume", "resume a paused worker"), ("stop", "stop the running worker after its current "
                                                                    "step")):
        q = sub.add_parser(kind, parents=[common_parent()], help=text)
        if kind == "stop":
            q.add_argument("--wait", type=nonneg_float, default=0.0, metavar="S",
                           help="wait up to S seconds for the worker to exit")
        q.set_defaults(func=cmd_control, kind=kind)

    e = sub.add_parser("export", parents=[common_parent()], help="write the incumbent (or ID) back into tik_kernels/")
    e.add_argument("op")
    e.add_argument("id", nargs="?", type=impl_id)
    e.add_argument("--to", type=Path, default=None, help="directory to write <op>.py into (default: tik_kernels/ops/)")
    e.add_argument("--force", action="store_true", help="export even an implementation that is not verified")
    e.set_defaults(func=cmd_export)


def _open(path: Path):
    from tik_store import Workspace, WorkspaceError

    try:
        return Workspace.open(path)
    except WorkspaceError as e:
        raise TikError(str(e)) from None


# ----------------------------------------------------------------------------- search


#: loop events `tik search` prints on stderr (one line each); the rest stay in the store's event log
PROGRESS_KINDS = ("selected", "proposed", "proposal_failed", "evaluated", "decided", "queued", "screen", "eval_retry",
                  "exhausted", "duplicate", "llm_retry", "proposal_error", "resume_evaluate", "search_resumed",
                  "paused", "resumed", "retime")


def _progress(kind: str, p: dict) -> None:
    """One line per step on stderr (stdout stays clean for --json): `tik: rmsnorm #12: verified, 0.950× ...`."""
    from tik_tui.events import describe

    if kind not in PROGRESS_KINDS:
        return
    impl_id = p.get("impl_id")
    if impl_id is None and kind in ("proposed", "proposal_failed", "evaluated", "decided", "queued", "eval_retry"):
        impl_id = p.get("id")
    where = " ".join(s for s in (p.get("op") or "", f"#{impl_id}" if impl_id is not None else "") if s)
    line = describe(kind, p, impl_id=impl_id)
    print(f"tik: {where + ': ' if where else ''}{line}", file=sys.stderr, flush=True)


def cmd_search(args: argparse.Namespace) -> int:
    from tik_tui.agent import ProposerFatal, default_proposer
    from tik_tui.agent.executor import ExecutorError, check_options
    from tik_tui.agent.pricing import money
    from tik_tui.worker import WorkerBusy, run_search, sandbox_choice, search_argv, search_kwargs, worker_busy

    with _open(args.workspace) as ws:
        _sources_readable(ws, args.ops)
    busy = worker_busy(args.workspace)
    if busy:
        raise TikError(f"{busy}: `tik stop` it first, or watch it with `tik status`")
    if args.proposer == "claude" and not os.environ.get("ANTHROPIC_API_KEY"):
        raise TikError("ANTHROPIC_API_KEY is not set (export it, or use --proposer tuner)")
    if (args.proposer or default_proposer()) == "claude":
        _check_claude_options(args)
    try:
        check_options(args.executor, args.address, args.workers)
    except ExecutorError as e:
        raise TikError(str(e)) from None
    refused = sandbox_choice(args)
    if refused:
        raise TikError(refused)
    if args.detach:
        return _detach(args, search_argv(args))
    try:
        kwargs = search_kwargs(args)
        summary = run_search(args.workspace, on_event=None if args.json else _progress, **kwargs)
    except WorkerBusy as e:
        raise TikError(str(e)) from None
    except (ProposerFatal, ValueError, FileNotFoundError) as e:
        raise TikError(str(e)) from None
    if args.json:
        print_json(summary)
    else:
        print(f"{summary['state']}: {summary['stop_reason']}; {summary['spent']} derivations"
              + (f", {summary['tokens']} tokens, cost {money(summary['cost_usd'])}" if summary["tokens"] else "")
              + " (tik log to see them)")
    if (summary.get("stop_reason") or "").startswith("error: "):
        raise TikError(summary["stop_reason"][len("error: "):])
    return 0


def _check_claude_options(args: argparse.Namespace) -> None:
    """Options the model would reject, and a dollar budget on a model without a price: refused before anything
    starts (a detached worker would only say so in its log)."""
    from tik_tui.agent.claude import DEFAULT_MODEL
    from tik_tui.agent.pricing import check_max_cost, request_options

    model = args.model or os.environ.get("TIK_MODEL") or DEFAULT_MODEL
    try:
        request_options(model, args.thinking, args.effort)
        if args.max_cost is not None:
            check_max_cost(model)
    except ValueError as e:
        raise TikError(str(e)) from None


def _sources_readable(ws, ops: list[str] | None) -> None:
    """Every incumbent the search starts from can be read: a workspace missing git objects is a one-line error
    here, before the worker records a search that cannot start."""
    from tik_store import WorkspaceError

    for op in ops or [r["op"] for r in ws.operators()]:
        inc = ws.incumbent(op)
        if inc is not None:
            try:
                ws.source(inc["id"])
            except WorkspaceError as e:
                raise TikError(f"{op} incumbent #{inc['id']}: {e}") from None


def _detach(args: argparse.Namespace, argv: list[str]) -> int:
    ws_path = Path(args.workspace).resolve()
    log = ws_path / "worker.log"
    cmd = [sys.executable, "-m", "tik_tui.worker", "-w", str(ws_path), *argv]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                close_fds=True)
    ws = _open(ws_path)
    deadline = time.time() + 15.0
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                raise TikError(f"worker exited at once (status {proc.returncode}): {tail[0] if tail else 'no output'}")
            st = ws.worker_state() or {}
            if st.get("pid") == proc.pid and st.get("state") in ("running", "paused", "finished", "stopped"):
                break
            time.sleep(0.1)
    finally:
        ws.close()
    doc = {"pid": proc.pid, "workspace": str(ws_path), "log": str(log)}
    if args.json:
        print_json(doc)
    else:
        print(f"worker started (pid {proc.pid}); follow it with `tik status`, stop it with `tik stop`; log: {log}")
    return 0


# ----------------------------------------------------------------------------- control


def cmd_control(args: argparse.Namespace) -> int:
    from tik_tui.worker import worker_busy

    ws = _open(args.workspace)
    try:
        if not worker_busy(args.workspace):
            raise TikError(f"no worker is running on {args.workspace} (start one with `tik search --detach`)")
        cid = ws.send_command(args.kind)
        stopped = None
        if args.kind == "stop" and args.wait > 0:
            deadline = time.time() + args.wait
            while time.time() < deadline and worker_busy(args.workspace):
                time.sleep(0.2)
            stopped = not worker_busy(args.workspace)
    finally:
        ws.close()
    if args.json:
        print_json({"command": cid, "kind": args.kind, **({"stopped": stopped} if stopped is not None else {})})
    else:
        print(f"{args.kind} sent (command {cid})" + ("" if stopped is None else
                                                      "; worker exited" if stopped else "; worker still running"))
    return 0 if stopped is not False else 1


# ----------------------------------------------------------------------------- export


def library_ops_dir() -> Path:
    spec = importlib.util.find_spec("tik_kernels")
    if spec is None or not spec.submodule_search_locations:
        raise TikError("the tik_kernels package is not importable here: pass --to DIR")
    return Path(list(spec.submodule_search_locations)[0]) / "ops"


def cmd_export(args: argparse.Namespace) -> int:
    from tik_store import WorkspaceError

    ws = _open(args.workspace)
    try:
        if args.op not in {r["op"] for r in ws.operators()}:
            raise TikError(f"unknown operator {args.op!r} in this workspace")
        if args.id is None:
            row = ws.incumbent(args.op)
            if row is None:
                raise TikError(f"no promoted implementation of {args.op} yet: pass an ID (see `tik log --op "
                               f"{args.op}`)")
        else:
            try:
                row = ws.implementation(args.id)
            except WorkspaceError:
                row = None
            if row is None:
                raise TikError(f"no implementation #{args.id}")
        if row["op"] != args.op:
            raise TikError(f"#{row['id']} is a {row['op']} implementation, not {args.op}")
        if row["status"] not in EXPORTABLE and not args.force:
            raise TikError(f"#{row['id']} is {row['status']}: only a verified implementation is exported "
                           "(--force to override)")
        source = ws.source(row["id"])
    finally:
        ws.close()
    dest_dir = args.to if args.to is not None else library_ops_dir()
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / f"{args.op}.py"
    dest.write_text(source)
    if args.json:
        print_json({"op": args.op, "id": row["id"], "status": row["status"], "path": str(dest)})
    else:
        print(f"wrote #{row['id']} ({row['status']}) to {dest}")
    return 0
