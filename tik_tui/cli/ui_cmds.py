"""`tik tui` (also what a bare `tik` runs) and `tik serve`: the Textual application on a workspace.

Textual is imported inside the handlers, so the rest of the command line starts without it.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from tik_tui.cli.common import TikError, common_parent


def register(sub) -> None:
    p = sub.add_parser("tui", parents=[common_parent(json_flag=False)],
                       help="the terminal UI on the workspace (also what a bare `tik` runs)")
    p.set_defaults(func=cmd_tui)
    p = sub.add_parser("serve", parents=[common_parent(json_flag=False)],
                       help="the terminal UI in a browser, on 127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="TCP port on 127.0.0.1 (default 8000)")
    p.set_defaults(func=cmd_serve)


def _check_workspace(args: argparse.Namespace) -> None:
    """Fail before the application starts: a UI on a missing workspace would only show an error."""
    from tik_store import Workspace, WorkspaceError
    from tik_store.errors import ReadOnlyWorkspace

    try:
        try:
            Workspace.open(args.workspace).close()
        except ReadOnlyWorkspace:
            # the UI opens it for viewing
            Workspace.open(args.workspace, readonly=True).close()
    except WorkspaceError as e:
        raise TikError(str(e)) from e


def _load_config():
    from tik_tui.config import ConfigError, load_config

    try:
        return load_config()
    except ConfigError as e:
        raise TikError(str(e)) from e


def cmd_tui(args: argparse.Namespace) -> int:
    _check_workspace(args)
    config = _load_config()
    from tik_tui.app import TikApp

    TikApp(args.workspace, config=config).run()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    _check_workspace(args)
    _load_config()
    if not 0 < args.port < 65536:
        raise TikError(f"--port must be in 1..65535, not {args.port}")
    from textual_serve.server import Server

    command = shlex.join([sys.executable, "-m", "tik_tui.cli.main",
                          "-w", str(args.workspace.resolve()), "tui"])
    print(f"tik: serving the UI on http://127.0.0.1:{args.port} (ctrl+c stops)", file=sys.stderr)
    Server(command, host="127.0.0.1", port=args.port, title="TIK").serve()
    return 0
