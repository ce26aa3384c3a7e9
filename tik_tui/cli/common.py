"""Shared pieces of the command line: the error type, the common options, JSON output."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any


class TikError(Exception):
    """A user-facing error: a one-line cause, no traceback. `code` is the process exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line like every other error (`tik: error: --budget must be at least 1, not 0
    (see `tik search --help`)`), exit status 2: no usage block above it (a subcommand's usage runs to a
    dozen lines and hid the reason)."""

    def error(self, message: str):
        m = re.fullmatch(r"argument (\S+?)(?:/\S+)?: (.*)", message, flags=re.S)
        if m:
            # `argument --budget: must be ...` -> `--budget must be ...`; a positional keeps its colon
            message = f"{m.group(1)} {m.group(2)}" if m.group(1).startswith("-") else f"{m.group(1)}: {m.group(2)}"
        self.exit(2, f"tik: error: {message} (see `{self.prog} --help`)\n")


#: the largest id sqlite stores (a larger one raised OverflowError from the driver)
MAX_ID = 2**63 - 1


def impl_id(text: str) -> int:
    """An implementation id, `12` or `#12`."""
    try:
        value = int(text.strip().lstrip("#"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an implementation id: {text!r}") from None
    if not 0 < value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"no implementation has id {text} (ids are whole numbers from 1)")
    return value


def _number(text: str, cast: type) -> float | int:
    try:
        value = cast(text)
    except ValueError:
        kind = "a whole number" if cast is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {kind}, not {text!r}") from None
    if cast is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


def positive_int(text: str) -> int:
    """At least 1: budgets, patience, token limits, worker counts (0 would stop before the first step)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def nonneg_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_float(text: str) -> float:
    """Seconds and dollars: finite and above 0 (a negative timeout recorded a false failed derivation)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def nonneg_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def regex(text: str) -> str:
    """A regular expression (kept as text, matched with re.search), checked when the arguments are parsed."""
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({e})") from None
    return text


def common_parent(json_flag: bool = True) -> argparse.ArgumentParser:
    """Options every subcommand accepts after its name too: `tik log -w DIR --json`."""
    p = OneLineParser(add_help=False)
    p.add_argument("-w", "--workspace", type=Path, default=argparse.SUPPRESS,
                   help="workspace directory (default: $TIK_WORKSPACE, else ./.tik)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    return p


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")

