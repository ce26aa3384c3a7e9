"""The `replay:FILE` proposer: recorded proposals, for tests and demos.

FILE is a JSON list or JSONL, one record per proposal, used in order. A record is either a
recorded Messages API response (`{"type": "message", "content": [... a tool_use of
submit_implementation ...], "usage": {...}}`) or a plain proposal:

    {"source": "..."} | {"source_file": "rel/to/FILE.py"} | {"config": {...}} | {"replace": [[old, new], ...]}
    optional: "rationale", "modification", "usage", "parent" and "merge_with" (a selector)
    {"error": "..."} simulates a malformed response (a failed proposal)

`config` rewrites the parent's CONFIG, `replace` edits the parent's source. Selectors:
"root", "incumbent", an implementation id, or "@k" (the derivation made from record k,
counting from 0). Progress is read back from the store (each derivation carries its
`replay_index`), so a restarted worker continues with the next record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tik_tui.agent.base import (
    NothingToPropose,
    Proposal,
    ProposalContext,
    ProposalFailed,
    ProposerFatal,
    check_source,
    modification_of,
)
from tik_tui.agent.tuner import rewrite_config


def load_records(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ProposerFatal(f"cannot read replay file {path}: {e.strerror}") from None
    try:
        if text.lstrip().startswith("["):
            records = json.loads(text)
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ProposerFatal(f"replay file {path} is not JSON/JSONL: line {e.lineno}: {e.msg}") from None
    if not all(isinstance(r, dict) for r in records):
        raise ProposerFatal(f"replay file {path}: every record must be an object")
    return records


class ReplayProposer:
    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.records = load_records(self.path)
        self.tag = self.path.name
        self._next = 0
        self._cache: dict[int, dict] = {}

    # ------------------------------------------------------------------ progress, from the store

    def _made(self, store: Any) -> dict[int, int]:
        """replay_index -> implementation id, for this file's records already recorded."""
        made: dict[int, int] = {}
        if store is None:
            return made
        for row in store.implementations():
            if row["id"] not in self._cache:
                self._cache[row["id"]] = modification_of(store.implementation(row["id"]))
            mod = self._cache[row["id"]]
            if mod.get("replay_file") == self.tag and isinstance(mod.get("replay_index"), int):
                made[mod["replay_index"]] = row["id"]
        return made

    def next_index(self, store: Any) -> int:
        made = self._made(store)
        return max(self._next, max(made) + 1 if made else 0)

    def _resolve(self, sel: Any, op: str, store: Any) -> int | None:
        if sel is None or store is None:
            return None
        if sel == "root":
            row = store.root(op)
        elif sel == "incumbent":
            row = store.incumbent(op) or store.root(op)
        elif isinstance(sel, str) and sel.startswith("@"):
            impl = self._made(store).get(int(sel[1:]))
            if impl is None:
                raise ProposerFatal(f"replay record refers to {sel}, which was never recorded")
            return impl
        else:
            return int(sel)
        return row["id"] if row else None

    def preferred_parent(self, op: str, store: Any) -> tuple[int | None, int | None]:
        """(parent id, merge partner id) the next record asks for; None where it leaves the choice to the loop."""
        i = self.next_index(store)
        if i >= len(self.records):
            return None, None
        rec = self.records[i]
        return self._resolve(rec.get("parent"), op, store), self._resolve(rec.get("merge_with"), op, store)

    # ------------------------------------------------------------------ proposing

    def propose(self, ctx: ProposalContext) -> Proposal:
        i = self.next_index(ctx.store)
        if i >= len(self.records):
            raise NothingToPropose(f"replay file {self.tag} used up ({len(self.records)} records)", everywhere=True)
        self._next = i + 1
        rec = self.records[i]
        tag = {"replay_file": self.tag, "replay_index": i}
        entries = tuple(ctx.contract.get("entries") or ())
        if rec.get("type") == "message":
            return self._from_message(rec, tag, entries, ctx)
        usage = rec.get("usage")
        if "error" in rec:
            raise ProposalFailed(str(rec["error"]), source=rec.get("source"), usage=usage,
                                 rationale=str(rec.get("rationale", "")), modification={"kind": "replay", **tag})
        if "source" in rec:
            source = rec["source"]
        elif "source_file" in rec:
            source = (self.path.parent / rec["source_file"]).read_text()
        elif "config" in rec:
            cfg = {**_literal_config(ctx.parent_source), **rec["config"]}
            source = rewrite_config(ctx.parent_source, cfg)
        elif "replace" in rec:
            source = ctx.parent_source
            for old, new in rec["replace"]:
                if old not in source:
                    raise ProposalFailed(f"replay edit does not apply: {old[:60]!r} not in the parent", usage=usage,
                                         modification={"kind": "replay", **tag})
                source = source.replace(old, new, 1)
        else:
            raise ProposerFatal(f"replay record {i} has none of source/source_file/config/replace/error")
        try:
            check_source(source, entries)
        except ProposalFailed as e:
            e.usage, e.modification = usage, {"kind": "replay", **tag}
            raise
        mod = {"kind": "merge" if ctx.merge_with else "replay", **(rec.get("modification") or {}), **tag}
        extra = (ctx.merge_with["id"],) if ctx.merge_with else ()
        return Proposal(source=source, rationale=str(rec.get("rationale", f"replay record {i}")), modification=mod,
                        usage=usage, extra_parents=extra)

    def _from_message(self, rec: dict, tag: dict, entries: tuple, ctx: ProposalContext) -> Proposal:
        from tik_tui.agent.pricing import cost_usd

        u = rec.get("usage") or {}
        model = rec.get("model", "replay")
        usage = {"model": model, "input_tokens": int(u.get("input_tokens", 0)),
                 "output_tokens": int(u.get("output_tokens", 0)),
                 "cache_read_tokens": int(u.get("cache_read_input_tokens") or 0),
                 "cache_write_tokens": int(u.get("cache_creation_input_tokens") or 0)}
        cost = cost_usd(model, usage["input_tokens"], usage["output_tokens"], usage["cache_write_tokens"],
                        usage["cache_read_tokens"])
        usage["cost_usd"] = None if cost is None else round(cost, 6)
        subs = [b for b in rec.get("content", []) if b.get("type") == "tool_use"
                and b.get("name") == "submit_implementation"]
        if not subs or not isinstance(subs[0].get("input"), dict):
            raise ProposalFailed("recorded response has no well-formed submit_implementation", usage=usage,
                                 modification={"kind": "replay", **tag})
        args = subs[0]["input"]
        try:
            check_source(args.get("source"), entries)
        except ProposalFailed as e:
            e.usage, e.modification = usage, {"kind": "replay", **tag}
            raise
        mod = {"kind": "rewrite", **{k: str(args.get(k, "")) for k in ("mechanism", "expected_effect",
                                                                      "numerical_risks")}, **tag}
        extra = (ctx.merge_with["id"],) if ctx.merge_with else ()
        return Proposal(source=args["source"], rationale=str(args.get("rationale", "")), modification=mod,
                        usage=usage, extra_parents=extra)


def _literal_config(source: str) -> dict:
    from tik_tui.agent.base import module_literal

    cfg = module_literal(source, "CONFIG")
    return cfg if isinstance(cfg, dict) else {}
