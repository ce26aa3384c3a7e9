"""Shared pieces of the command line: the error type, the common options, JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


class TikError(Exception):
    """A user-facing error: a one-line cause, no traceback. `code` is the process exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def common_parent(json_flag: bool = True) -> argparse.ArgumentParser:
    """Options every subcommand accepts after its name too: `tik log -w DIR --json`."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-w", "--workspace", type=Path, default=argparse.SUPPRESS,
                   help="workspace directory (default: $TIK_WORKSPACE, else ./.tik)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    return p


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")

