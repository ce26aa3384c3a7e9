"""`tik`: the command line. Subcommand groups live in sibling modules, each with `register(sub)`.

Every handler takes the parsed `argparse.Namespace` and returns an exit status. With `--json`
a command prints one JSON document on stdout and nothing else there; errors go to stderr as
one line (`tik: error: ...`) with a non-zero exit, never a traceback for a user mistake.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sqlite3
import sys
from pathlib import Path

from tik_store.errors import WorkspaceError, sqlite_problem
from tik_tui.cli.common import OneLineParser, TikError

#: modules that contribute subcommands, in help order
GROUPS = (
    "tik_tui.cli.store_cmds",  # init, log, show, status, approve, reject, doctor
    "tik_tui.cli.eval_cmds",  # ops, check, bench
    "tik_tui.cli.search_cmds",  # search, pause/resume/stop, export
    "tik_tui.cli.ui_cmds",  # tui, serve
    "tik_tui.cli.e2e_cmds",  # e2e
)


def default_workspace() -> Path:
    return Path(os.environ.get("TIK_WORKSPACE") or ".tik")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = OneLineParser(
        prog="tik", description="TIK: unified bitwise-consistent RL kernels and their agent")
    parser.add_argument("-w", "--workspace", type=Path, default=None,
                        help="workspace directory (default: $TIK_WORKSPACE, else ./.tik)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in GROUPS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.register(sub)
    parser.set_defaults(commands=sorted(sub.choices))
    return parser


def _os_error_line(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return f"disk full: {e.filename or ''} (free some space and retry)".strip()
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {e.filename or 'the workspace'}: {e.strerror}"
    return f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # a usage error (already printed, one line) or --help: a status to return, also when called in-process
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    args.workspace = args.workspace or default_workspace()
    if args.command is None:
        # bare `tik` opens the terminal UI
        if "tui" not in args.commands:
            parser.print_help()
            return 0
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), "tui"])
        args.workspace = args.workspace or default_workspace()
    try:
        return int(args.func(args) or 0)
    except TikError as e:
        print(f"tik: error: {e}", file=sys.stderr)
        return e.code
    except WorkspaceError as e:
        # any store problem a command did not word itself: a damaged, read-only or full workspace
        print(f"tik: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tik: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`tik log | head`): stop quietly, as other command-line tools do
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except sqlite3.OperationalError as e:
        print(f"tik: error: {sqlite_problem(e, args.workspace, Path(args.workspace) / 'tik.db')}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tik: error: {_os_error_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
