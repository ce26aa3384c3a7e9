"""The offline proposer: moves an implementation's CONFIG within its declared TUNABLES.

It rewrites only the value of the module-level `CONFIG = {...}` literal (through `ast`
positions, so every other byte of the file is kept), one value per key from `TUNABLES[key]`,
and never touches a key the contract freezes (those change the reduction order).

Search order from a parent: its neighbours first (one key moved one step along its allowed
values), nearest keys in declaration order; then two-key moves; then any untried point of
the grid. Configurations already tried anywhere for the operator are skipped, so a restart
or a second branch never repeats one. Which parent to expand is the loop's choice.
"""

from __future__ import annotations

import ast
import itertools
import random

from tik_tui.agent.base import NothingToPropose, Proposal, ProposalContext, config_key, module_literal

#: grids larger than this are sampled rather than enumerated
_GRID_LIMIT = 4096


def _config_node(tree: ast.Module) -> ast.Dict | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            return node.value if isinstance(node.value, ast.Dict) else None
    return None


def rewrite_config(source: str, config: dict) -> str:
    """`source` with the CONFIG literal's value replaced by `config` (keys in the original order)."""
    tree = ast.parse(source)
    node = _config_node(tree)
    if node is None:
        raise ValueError("no literal CONFIG dict at module level")
    lines = source.splitlines(keepends=True)
    # ast offsets are in UTF-8 bytes per line
    start = sum(len(line.encode()) for line in lines[: node.lineno - 1]) + node.col_offset
    end = sum(len(line.encode()) for line in lines[: node.end_lineno - 1]) + node.end_col_offset
    body = ", ".join(f"{k!r}: {v!r}" for k, v in config.items())
    raw = source.encode()
    return (raw[:start] + ("{" + body + "}").encode() + raw[end:]).decode()


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

    for k in keys:
        for v in step(config, k):
            yield {**config, k: v}
    for a, b in itertools.combinations(keys, 2):
        for va in step(config, a):
            for vb in step(config, b):
                yield {**config, a: va, b: vb}
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


class TunerProposer:
    """`tuner`: no key, no network; the default when ANTHROPIC_API_KEY is unset."""

    name = "tuner"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def propose(self, ctx: ProposalContext) -> Proposal:
        frozen = set(ctx.contract.get("frozen_tunables") or ())
        config, space = tunable_space(ctx.parent_source, frozen)
        if not space:
            raise NothingToPropose(f"#{ctx.parent.get('id')} declares no movable TUNABLES")
        tried = set(ctx.tried_configs) | {config_key(config)}
        rng = random.Random(f"{self.seed}:{ctx.parent.get('id')}:{len(tried)}")
        for cand in _moves(config, space, rng):
            if config_key(cand) in tried:
                continue
            changed = {k: (config[k], cand[k]) for k in cand if cand[k] != config[k]}
            source = rewrite_config(ctx.parent_source, cand)
            desc = ", ".join(f"{k} {a!r}→{b!r}" for k, (a, b) in changed.items())
            return Proposal(
                source=source,
                rationale=f"tune {desc}",
                modification={"kind": "tune", "mechanism": "config", "config": cand,
                               "changed": {k: b for k, (_, b) in changed.items()}},
            )
        raise NothingToPropose(f"every allowed config around #{ctx.parent.get('id')} was tried")
