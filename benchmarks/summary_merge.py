"""Merge the card summaries that GPU calls brought back into the repository's one.

Each GPU call starts from a copy of `benchmarks/results/summary_<card>.json` and its benchmarks update their own keys
in that copy (`harness.update_summary`), naming the files they wrote where the call wrote them (`/tmp/r/...`). After
several calls the copies disagree: each holds its own call's keys and the repository's old values for the rest. This
takes, key by key, the value with the latest provenance date among the repository's summary and the copies (a copy
that merely carries an old value back changes nothing), and rewrites the provenance's file to where the results
were saved in the repository:

    python benchmarks/summary_merge.py --into benchmarks/results/summary_h100.json call1/summary_h100.json \\
        call2/summary_h100.json --rename /tmp/r/speed_h100.json=benchmarks/results/speed_h100_s33.json

It prints each key it changes, and a warning for a provenance file that is not in the repository."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def merge(into: dict, copies: list[dict], renames: dict[str, str]) -> tuple[dict, list[str]]:
    """(the merged summary, one line per key that changed). A key's value and provenance come from whichever of
    `into` and `copies` has the latest provenance date for it (`into` on a tie); keys without provenance in a copy
    are ignored. Provenance files named in `renames` are rewritten, in the result's every key."""
    out = json.loads(json.dumps(into))
    prov = out.setdefault("_provenance", {})
    changed = []
    for copy in copies:
        for key, p in copy.get("_provenance", {}).items():
            if key.startswith("_") or key not in copy or not isinstance(p, dict):
                continue
            if p.get("date", "") > prov.get(key, {}).get("date", ""):
                old = out.get(key)
                out[key], prov[key] = copy[key], dict(p)
                changed.append(f"{key}: {old} -> {copy[key]} ({p.get('date')})")
    for p in prov.values():
        if isinstance(p, dict) and p.get("file") in renames:
            p["file"] = renames[p["file"]]
    return out, changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("copies", nargs="+", type=Path, help="summaries a GPU call brought back")
    ap.add_argument("--into", type=Path, required=True, help="the repository's summary, rewritten in place")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="a provenance file as the call named it = where it is saved in the repository (repeatable)")
    a = ap.parse_args(argv)
    renames = {}
    for r in a.rename:
        old, sep, new = r.partition("=")
        if not sep or not old or not new:
            print(f"summary_merge: --rename takes OLD=NEW, not {r!r}", file=sys.stderr)
            return 2
        renames[old] = new
    try:
        into = json.loads(a.into.read_text())
        copies = [json.loads(p.read_text()) for p in a.copies]
    except (OSError, json.JSONDecodeError) as e:
        print(f"summary_merge: {e}", file=sys.stderr)
        return 2
    out, changed = merge(into, copies, renames)
    a.into.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    for line in changed:
        print(line)
    for key, p in sorted(out.get("_provenance", {}).items()):
        f = p.get("file", "") if isinstance(p, dict) else ""
        if f and not any(q.exists() for q in (ROOT / f, ROOT / "benchmarks" / "results" / f, Path(f))):
            print(f"warning: {key}'s file {f} is not in the repository (--rename it)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
