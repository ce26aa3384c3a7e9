"""The offline proposer: moves an implementation's CONFIG within its declared TUNABLES.

It rewrites only the value of the module-level `CONFIG = {...}` literal (through `ast`
positions, so every other byte of the file is kept), one value per key from `TUNABLES[key]`,
and never touches a key the contract freezes (those change the reduction order).

Search order from a parent: its neighbours first (one key moved one step along its allowed
values), in a seeded random order; then two-key moves, likewise; then any untried point of
the grid. Configurations already tried anywhere for the operator are skipped, so a restart
or a second branch never repeats one. Which parent to expand is the loop's choice.

With a screen (`ProposalContext.screen`, the loop's `--screen N`, on a timed device) the tuner
runs successive halving before it spends an evaluation: the next N untried moves are timed
beside the parent with a few rounds per cell (rung 0), the best third are timed again with
three times the rounds (rung 1), and so on while a rung would keep two or more; the best of
the last rung is proposed only if it beat the parent there. Every rung is recorded as a `screen` event on the
parent, so a restarted search (or the next proposal from that parent) reuses what was
screened instead of timing it again. When two fresh batches hold no move faster than the parent,
the closest one within SCREEN_TIE of it is evaluated all the same (a screen's few rounds cannot
tell a few tenths of a percent apart) and the next proposal screens further moves; a parent whose
screened moves are all further behind is exhausted for the tuner. Moves whose tiles exceed the
root's declared shared memory (`fits`) are never screened or proposed. A screen that fails (its
child timed out or died) is recorded and the tuner falls back to proposing the next move unscreened.
"""

from __future__ import annotations

import ast
import functools
import itertools
import random
from typing import Any

from tik_tui.agent.base import NothingToPropose, Proposal, ProposalContext, config_key, module_literal

#: grids larger than this are sampled rather than enumerated
_GRID_LIMIT = 4096
#: when two fresh batches screened around a parent hold no move faster than it, the best one within this fraction of
#: it (screens of 6-18 rounds per cell move by a few tenths of a percent) is still evaluated, and the next proposal
#: screens further moves; the parent is exhausted only when none comes that close. On the H200 linear's root ended a
#: 20-minute search after 85 s: its best screened moves were 0.998-1.001x of it, 24 of its ~150 one-key moves seen.
SCREEN_TIE = 0.005


def _config_node(tree: ast.Module) -> ast.Dict | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            return node.value if isinstance(node.value, ast.Dict) else None
    return None


def rewrite_config(source: str, config: dict) -> str:
    """`source` with the CONFIG literal holding `config`.

    When `config` has exactly the literal's keys (every tuner move), only each changed value's text
    is replaced, in place: comments, layout and line numbers stay. That matters beyond tidiness:
    Triton's cache key holds a kernel's starting line, so a rewrite that moved the kernels below
    CONFIG would make every kernel of the candidate compile again instead of loading the root's.
    Otherwise the whole literal is replaced (keys in `config`'s order).
    """
    literal, entries = _config_spans(source)
    raw = source.encode()
    keys = [k for k, _, _ in entries]
    if None not in keys and len(set(keys)) == len(keys) and set(keys) == set(config):
        edits = [(*span, repr(config[k]).encode()) for k, span, value in entries
                 if value is _NOT_LITERAL or value != config[k] or type(value) is not type(config[k])]
        for a, b, text in sorted(edits, reverse=True):
            raw = raw[:a] + text + raw[b:]
        return raw.decode()
    start, end = literal
    body = ", ".join(f"{k!r}: {v!r}" for k, v in config.items())
    return (raw[:start] + ("{" + body + "}").encode() + raw[end:]).decode()


#: a CONFIG value that is not a literal (`_config_spans`)
_NOT_LITERAL = object()


@functools.lru_cache(maxsize=32)
def _config_spans(source: str) -> tuple[tuple[int, int], tuple[tuple[Any, tuple[int, int], Any], ...]]:
    """Where `source`'s CONFIG literal is, in UTF-8 bytes: (its span, ((key or None, value span, value or
    _NOT_LITERAL), ...)). Parsed once per source: a search rewrites the same parent many times (linear's root took
    11 ms to parse, 24 times in a 24-candidate search). Immutable, so a cached answer cannot be changed by a caller."""
    node = _config_node(ast.parse(source))
    if node is None:
        raise ValueError("no literal CONFIG dict at module level")
    starts = [0]
    for line in source.splitlines(keepends=True):  # ast offsets are in UTF-8 bytes per line
        starts.append(starts[-1] + len(line.encode()))

    def span(n: ast.AST) -> tuple[int, int]:
        return starts[n.lineno - 1] + n.col_offset, starts[n.end_lineno - 1] + n.end_col_offset

    def value(v: ast.AST) -> Any:
        try:
            return ast.literal_eval(v)
        except ValueError:
            return _NOT_LITERAL

    entries = tuple((k.value if isinstance(k, ast.Constant) else None, span(v), value(v))
                    for k, v in zip(node.keys, node.values, strict=True))
    return span(node), entries


def tunable_space(source: str, frozen: set[str]) -> tuple[dict, dict[str, list]]:
    """(current CONFIG, {key: allowed values}) for the keys the tuner may move."""
    tunables = module_literal(source, "TUNABLES")
    config = module_literal(source, "CONFIG")
    if not isinstance(tunables, dict) or not isinstance(config, dict):
        return {}, {}
    space = {}
    for k, values in tunables.items():
        if k in frozen or k not in config:
            continue
        vals = list(values) if isinstance(values, (list, tuple)) else [values]
        if len(vals) > 1:
            space[k] = vals
    return config, space


def _moves(config: dict, space: dict[str, list], rng: random.Random):
    """Candidate configs from `config`: one-step neighbours, then two-key moves, then the grid."""
    keys = list(space)

    def step(cfg: dict, k: str):
        vals = space[k]
        i = vals.index(cfg[k]) if cfg[k] in vals else None
        if i is None:
            return [v for v in vals]
        return [vals[j] for j in (i - 1, i + 1) if 0 <= j < len(vals)]

    # each tier in a seeded random order: a screen's batch then spans the keys (a tile bucket per key
    # group, say) instead of the first few in declaration order
    ones = [{**config, k: v} for k in keys for v in step(config, k)]
    rng.shuffle(ones)
    yield from ones
    twos = [{**config, a: va, b: vb} for a, b in itertools.combinations(keys, 2)
            for va in step(config, a) for vb in step(config, b)]
    rng.shuffle(twos)
    yield from twos
    size = 1
    for k in keys:
        size *= len(space[k])
    if size <= _GRID_LIMIT:
        grid = [dict(zip(keys, vs, strict=True)) for vs in itertools.product(*(space[k] for k in keys))]
        rng.shuffle(grid)
        for point in grid:
            yield {**config, **point}
    else:
        for _ in range(_GRID_LIMIT):
            yield {**config, **{k: rng.choice(space[k]) for k in keys}}


def smem_bytes(config: dict, tile: tuple | list) -> int | None:
    """Shared memory a program of one tile keeps its pipelined operands in: num_stages x (BLOCK_M + BLOCK_N) x
    BLOCK_K x K_UNROLL elements of 2 bytes (a bf16 / fp16 `tl.dot`'s A and B slices). `tile` names the five
    CONFIG keys in that order (`SMEM_TILES`); None where a key is missing or not an integer."""
    try:
        bm, bn, bk, stages, unroll = (config[k] for k in tile)
    except (KeyError, TypeError, ValueError):
        return None
    if not all(type(v) is int for v in (bm, bn, bk, stages, unroll)):
        return None
    return stages * (bm + bn) * bk * unroll * 2


def fits(config: dict, tiles: object, limit: object) -> bool:
    """False when a tile of the module's `SMEM_TILES` ({name: five CONFIG keys}, see `smem_bytes`) needs more than its
    `SMEM_LIMIT` bytes: a launch Triton refuses with OutOfResources at the first probe (the H200's linear lost 11-23 s
    to each such move), not worth an evaluation. Modules that declare neither are not filtered."""
    if not isinstance(tiles, dict) or type(limit) is not int:
        return True
    return all((smem_bytes(config, t) or 0) <= limit for t in tiles.values() if isinstance(t, (tuple, list)))


def live(config: dict, key: str, when: object) -> bool:
    """Whether `key` can change a launch under `config`: the module's `TUNABLE_WHEN` ({key: {gate key: values the
    gate must hold}}) names the keys that only a path behind a gate reads (attention's DS_* tiles only under
    BWD_DS_STORE 1); a key it does not name, or a malformed entry, is live."""
    cond = when.get(key) if isinstance(when, dict) else None
    if not isinstance(cond, dict):
        return True
    return all(config.get(g) in (v if isinstance(v, (list, tuple)) else (v,)) for g, v in cond.items())


def moves_something(config: dict, cand: dict, when: object) -> bool:
    """False when a key `cand` changes is not `live` in `cand`: the move times the same launches as its parent (or as
    the smaller move without that key), an evaluation spent on noise."""
    return all(live(cand, k, when) for k in cand if cand[k] != config.get(k))


def feasible_moves(source: str, config: dict, space: dict[str, list], rng: random.Random):
    """`_moves` from `config`, less those whose tiles do not fit in the shared memory `source` declares (`fits`) and
    those that change a key no launch reads there (`moves_something`)."""
    tiles, limit = module_literal(source, "SMEM_TILES"), module_literal(source, "SMEM_LIMIT")
    when = module_literal(source, "TUNABLE_WHEN")
    return (c for c in _moves(config, space, rng) if fits(c, tiles, limit) and moves_something(config, c, when))


def _proposal(config: dict, cand: dict, source: str, note: str = "", screened: dict | None = None) -> Proposal:
    changed = {k: (config[k], cand[k]) for k in cand if cand[k] != config[k]}
    desc = ", ".join(f"{k} {a!r}→{b!r}" for k, (a, b) in changed.items())
    mod = {"kind": "tune", "mechanism": "config", "config": cand, "changed": {k: b for k, (_, b) in changed.items()}}
    if screened is not None:
        mod["screen"] = screened
    return Proposal(source=rewrite_config(source, cand), rationale=f"tune {desc}{note}", modification=mod)


class TunerProposer:
    """`tuner`: no key, no network; the default when ANTHROPIC_API_KEY is unset.

    `screen_rounds` rounds per cell on the first rung; each later rung keeps the best 1/`eta` of the
    moves and times them with `eta` times the rounds. The batch width is the context's (`screen_width`).
    """

    name = "tuner"

    def __init__(self, seed: int = 0, screen_rounds: int = 6, eta: int = 3, tie: float = SCREEN_TIE):
        self.seed = seed
        self.tie = tie
        self.screen_rounds = max(1, int(screen_rounds))
        self.eta = max(2, int(eta))
        #: screens seen in this process when the context has no store: (op, parent id) -> event payloads
        self._screens: dict[tuple[str, int], list[dict]] = {}

    def propose(self, ctx: ProposalContext) -> Proposal:
        frozen = set(ctx.contract.get("frozen_tunables") or ())
        config, space = tunable_space(ctx.parent_source, frozen)
        if not space:
            raise NothingToPropose(f"#{ctx.parent.get('id')} declares no movable TUNABLES")
        tried = set(ctx.tried_configs) | {config_key(config)}
        rng = random.Random(f"{self.seed}:{ctx.parent.get('id')}:{len(tried)}")
        moves = (c for c in feasible_moves(ctx.parent_source, config, space, rng) if config_key(c) not in tried)
        if ctx.screen is None or ctx.screen_width < 2:
            for cand in moves:
                return _proposal(config, cand, ctx.parent_source)
            raise NothingToPropose(f"every allowed config around #{ctx.parent.get('id')} was tried")
        return self._screened(ctx, config, tried, moves)

    # ------------------------------------------------------------------ successive halving

    def _history(self, ctx: ProposalContext) -> list[dict]:
        pid = ctx.parent.get("id")
        if ctx.store is not None and hasattr(ctx.store, "events"):
            return [e["payload"] for e in ctx.store.events(kind="screen", op=ctx.op, impl_id=pid)]
        return self._screens.get((ctx.op, pid), [])

    def _record(self, ctx: ProposalContext, payload: dict) -> None:
        if ctx.emit is not None:
            ctx.emit("screen", payload)
        if ctx.store is None or not hasattr(ctx.store, "events"):
            self._screens.setdefault((ctx.op, ctx.parent.get("id")), []).append(payload)

    def _screened(self, ctx: ProposalContext, config: dict, tried: set, moves) -> Proposal:
        pid = ctx.parent.get("id")
        for fresh in range(3):  # at most two fresh batches per proposal: then this parent is left for now
            # what earlier screens of this parent left: the pick of a batch's last rung, if not evaluated yet
            seen, best = set(), None
            for ev in self._history(ctx):
                entries = ev.get("entries", [])
                for e in entries:
                    seen.add(config_key({**config, **e.get("changed", {})}))
                pick = ev.get("pick")
                if ev.get("last") and isinstance(pick, int) and 0 <= pick < len(entries):
                    e = entries[pick]
                    cand = {**config, **e.get("changed", {})}
                    if config_key(cand) not in tried and (best is None or e["speedup"] > best[1]["speedup"]):
                        best = (cand, e, ev)
            if best is not None:
                return _screened_proposal(config, ctx.parent_source, pid, *best,
                                          f"best of {best[2].get('batch', '?')}")
            if fresh == 2:
                near = _nearest(self._history(ctx), config, tried, self.tie)
                if near is not None:
                    # none beat the parent, but the best is within the screen's noise of it: a full evaluation
                    # (more rounds, every cell) decides, and the next proposal screens further moves
                    return _screened_proposal(config, ctx.parent_source, pid, *near,
                                              f"within {self.tie:.1%} of it: an evaluation decides")
                break
            batch = []
            for cand in moves:
                if config_key(cand) not in seen:
                    batch.append(cand)
                    if len(batch) >= ctx.screen_width:
                        break
            if not batch:
                break
            if not self._halve(ctx, config, batch):
                # the screen itself failed: propose the first move of the batch unscreened
                return _proposal(config, batch[0], ctx.parent_source, " (unscreened: the screen failed)")
        if seen - tried:
            raise NothingToPropose(f"#{pid}: none of the {len(seen - tried)} configs screened around it "
                                   f"(and not yet evaluated) was faster than it")
        raise NothingToPropose(f"every allowed config around #{pid} was tried")

    def _halve(self, ctx: ProposalContext, config: dict, batch: list[dict]) -> bool:
        """Screen `batch` rung by rung, one `screen` event per rung; False when a rung's screen failed.

        The last rung's event names its `pick`: the best entry, when it beat the parent there."""
        alive = list(range(len(batch)))
        rounds, rung = self.screen_rounds, 0
        while True:
            res = ctx.screen([rewrite_config(ctx.parent_source, batch[i]) for i in alive], rounds)
            results = list(res.get("results") or [])
            failure = res.get("failure") or (None if len(results) == len(alive) else "screen: results missing")
            entries = []
            for n, i in enumerate(alive):
                r = results[n] if not failure else {}
                e = {"changed": {k: v for k, v in batch[i].items() if v != config.get(k)},
                     "speedup": r.get("speedup"), "error": r.get("error"), "cells": r.get("cells", {})}
                over = over_limit(e["cells"], res.get("limits") or {})
                if over:
                    e["over_limit"] = over
                entries.append(e)
            # a move that slows a cell past its admissibility limit is not evaluated, however fast the sum: every
            # derivation from it would inherit that cell (H200, attention: the first move, 2 decode chunks per
            # program, summed 0.998x the root with decode at L = 1k 1.36x; the next 10 derivations of a 20-minute
            # search all came from it and none was admissible)
            ranked = sorted((j for j, e in enumerate(entries) if e["speedup"] is not None and "over_limit" not in e),
                            key=lambda j: -entries[j]["speedup"])
            # the last rung: a failure, none faster than the parent, or a next rung would keep only one
            keep = len(alive) // self.eta
            last = bool(failure) or keep < 2 or not ranked or entries[ranked[0]]["speedup"] <= 1.0
            pick = ranked[0] if last and not failure and ranked and entries[ranked[0]]["speedup"] > 1.0 else None
            self._record(ctx, {"rung": rung, "rounds": rounds, "batch": len(batch), "last": last, "pick": pick,
                               "failure": failure, "seconds": res.get("seconds"),
                               "parent_objective": res.get("parent_objective"), "entries": entries})
            if failure:
                return False
            if last:
                return True
            alive = [alive[j] for j in ranked[:keep]]
            rounds *= self.eta
            rung += 1


def over_limit(cells: dict, limits: dict) -> str | None:
    """The first cell a screen saw slower than the parent by more than the cell's admissibility limit (`cells`:
    parent µs / variant µs; `limits`: the contract's, against the root, applied here against the parent)."""
    for cell, r in cells.items():
        lim = limits.get(cell)
        if isinstance(r, (int, float)) and isinstance(lim, (int, float)) and 0 < r < 1.0 / (1.0 + lim):
            return f"{cell} {1 / r:.3f}x > {1 + lim:.3f}x"
    return None


def _screened_proposal(config: dict, source: str, pid: Any, cand: dict, e: dict, ev: dict, why: str) -> Proposal:
    """The proposal of a screened move `cand` (its screen entry `e`, of event `ev`), its rationale saying why."""
    note = f" (screened: {1 / e['speedup']:.3f}× #{pid} over {ev['rounds']} rounds/cell, {why})"
    return _proposal(config, cand, source, note, {"speedup": e["speedup"], "rounds": ev["rounds"],
                                                  "batch": ev.get("batch")})


def _nearest(history: list[dict], config: dict, tried: set, tie: float) -> tuple[dict, dict, dict] | None:
    """The screened move closest to the parent that is not yet evaluated, if within `tie` of it: (config, entry,
    event); of equal speedups the one screened with more rounds."""
    best = None
    for ev in history:
        for e in ev.get("entries", []):
            sp = e.get("speedup")
            if not isinstance(sp, (int, float)) or sp < 1.0 - tie or e.get("over_limit"):
                continue
            cand = {**config, **e.get("changed", {})}
            if config_key(cand) in tried:
                continue
            rank = (sp, ev.get("rounds") or 0)
            if best is None or rank > best[0]:
                best = (rank, (cand, e, ev))
    return best[1] if best else None


def screen_summary(p: dict) -> str:
    """One rung of a screen (a `screen` event's payload) in a line, for the progress display and the UI."""
    entries = p.get("entries") or []
    head = (f"screened {len(entries)} config(s), rung {p.get('rung')}, {p.get('rounds')} rounds/cell, "
            f"{p.get('seconds') or 0:.0f} s")
    if p.get("failure"):
        return f"{head}: {p['failure']}"
    timed = [e for e in entries if e.get("speedup") is not None]
    if not timed:
        return f"{head}: none timed"
    errs = len(entries) - len(timed)
    over = [e for e in timed if e.get("over_limit")]
    tail = (f", {errs} failed" if errs else "") + (f", {len(over)} over a cell's limit" if over else "")
    timed = [e for e in timed if not e.get("over_limit")]
    if not timed:
        return f"{head}: none within every cell's limit{tail}"
    best = max(timed, key=lambda e: e["speedup"])
    desc = ", ".join(f"{k}={v}" for k, v in (best.get("changed") or {}).items())
    pick = "picked" if p.get("pick") is not None else ("none faster than the parent" if p.get("last")
                                                         else "best kept for the next rung")
    # the screen's `speedup` is parent time / config time; shown as a time ratio like every other ratio
    return f"{head}: best {desc} {1 / best['speedup']:.3f}× parent{tail}; {pick}"
