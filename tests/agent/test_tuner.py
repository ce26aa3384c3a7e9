"""The tuner: valid, distinct configs within TUNABLES; never a frozen key; never a byte outside CONFIG."""

import ast
import itertools
from pathlib import Path

import pytest
from agent_helpers import TOY_CONTRACT, TOY_SOURCE

from tik_tui.agent import NothingToPropose, ProposalContext, make_proposer
from tik_tui.agent.base import config_key, module_literal
from tik_tui.agent.tuner import rewrite_config


def _ctx(source, tried=(), contract=TOY_CONTRACT):
    return ProposalContext(op="toy", parent={"id": 1, "status": "verified"}, parent_source=source,
                           contract=contract, tried_configs=set(tried))


def _walk(tuner, source, tried, limit=100):
    """The tuner's proposals from `source` until it has nothing left (the caller adds each to `tried`)."""
    for _ in range(limit):
        try:
            yield tuner.propose(_ctx(source, tried))
        except NothingToPropose:
            return


def _outside_config(source):
    """Every top-level statement except the CONFIG assignment, as ast dumps, plus the text around it."""
    tree = ast.parse(source)
    others = [ast.dump(n) for n in tree.body
              if not (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "CONFIG" for t in n.targets))]
    lines = source.splitlines()
    keep = [ln for ln in lines if not ln.startswith("CONFIG =")]
    return others, keep


def test_rewrite_config_touches_only_the_config_value():
    new = rewrite_config(TOY_SOURCE, {"BLOCK": 128, "num_warps": 2, "SPLIT": 1})
    assert module_literal(new, "CONFIG") == {"BLOCK": 128, "num_warps": 2, "SPLIT": 1}
    assert _outside_config(new) == _outside_config(TOY_SOURCE)
    # byte-exact outside the literal
    before, after = TOY_SOURCE.split('{"BLOCK": 32, "num_warps": 4, "SPLIT": 1}')
    assert new.startswith(before) and new.endswith(after)


def test_rewrite_config_keeps_lines_comments_and_other_values():
    """Values change in place: a kernel below CONFIG keeps its line (Triton's cache key holds it)."""
    src = ('TUNABLES = {"A": (1, 2), "B": (8, 16)}\nCONFIG = {\n    "A": 1,  # one\n    "B": 8,\n}\n\n\n'
           "def kernel():\n    pass\n")
    new = rewrite_config(src, {"A": 2, "B": 8})
    assert new == src.replace('"A": 1,', '"A": 2,')
    assert rewrite_config(src, {"B": 16, "A": 1}) == src.replace('"B": 8,', '"B": 16,')
    # a different key set: the whole literal is rewritten
    assert module_literal(rewrite_config(src, {"A": 2}), "CONFIG") == {"A": 2}


def test_rewrite_config_on_the_library_linear_keeps_every_kernel_line():
    from pathlib import Path

    import tik_kernels.ops

    src = (Path(tik_kernels.ops.__file__).parent / "linear.py").read_text()
    cfg, space = module_literal(src, "CONFIG"), module_literal(src, "TUNABLES")
    # two keys moved to another allowed value, whatever the root's CONFIG holds today
    moved = {k: next(v for v in space[k] if v != cfg[k]) for k in ("M256_BLOCK_M", "MBIG_num_warps")}
    new = rewrite_config(src, {**cfg, **moved})
    assert module_literal(new, "CONFIG") == {**cfg, **moved}
    old_lines, new_lines = src.splitlines(), new.splitlines()
    assert len(old_lines) == len(new_lines)
    assert sum(a != b for a, b in zip(old_lines, new_lines, strict=True)) == 2


def test_rewrite_config_multiline_literal_and_unicode():
    src = '"""µ-kernel: ünïcode before CONFIG"""\nTUNABLES = {"A": (1, 2)}\nCONFIG = {\n    "A": 1,  # one\n}\nX = 3\n'
    new = rewrite_config(src, {"A": 2})
    assert module_literal(new, "CONFIG") == {"A": 2}
    assert new.endswith("\nX = 3\n") and new.startswith('"""µ-kernel')


def test_tuner_walks_the_whole_space_distinct_valid_and_never_the_frozen_key():
    tuner = make_proposer("tuner")
    tunables = module_literal(TOY_SOURCE, "TUNABLES")
    tried = {config_key(module_literal(TOY_SOURCE, "CONFIG"))}
    seen = []
    for p in _walk(tuner, TOY_SOURCE, tried):
        cfg = module_literal(p.source, "CONFIG")
        assert set(cfg) == {"BLOCK", "num_warps", "SPLIT"}
        assert all(cfg[k] in tunables[k] for k in cfg), cfg
        assert cfg["SPLIT"] == 1, "the tuner moved a frozen tunable"
        assert _outside_config(p.source) == _outside_config(TOY_SOURCE)
        assert p.modification["kind"] == "tune" and p.modification["config"] == cfg
        key = config_key(cfg)
        assert key not in tried, f"repeated config {cfg}"
        tried.add(key)
        seen.append(cfg)
    # every (BLOCK, num_warps) pair except the parent's own: 4 * 4 - 1, then it says it is done
    assert len(seen) == 15
    assert {(c["BLOCK"], c["num_warps"]) for c in seen} | {(32, 4)} == set(itertools.product((16, 32, 64, 128),
                                                                                              (1, 2, 4, 8)))


def test_tuner_neighbours_first():
    p = make_proposer("tuner").propose(_ctx(TOY_SOURCE))
    cfg = module_literal(p.source, "CONFIG")
    moved = [k for k in cfg if cfg[k] != {"BLOCK": 32, "num_warps": 4, "SPLIT": 1}[k]]
    assert len(moved) == 1, cfg
    assert "→" in p.rationale


def test_without_frozen_key_the_tuner_would_move_it():
    """The frozen-key guard is real: with no frozen_tunables, SPLIT does get moved."""
    tuner = make_proposer("tuner")
    contract = {**TOY_CONTRACT, "frozen_tunables": []}
    tried, splits = set(), set()
    for _ in range(40):
        try:
            p = tuner.propose(_ctx(TOY_SOURCE, tried, contract))
        except NothingToPropose:
            break
        cfg = module_literal(p.source, "CONFIG")
        tried.add(config_key(cfg))
        splits.add(cfg["SPLIT"])
    assert splits == {1, 2}


@pytest.mark.parametrize("source", ["def toy(x):\n    return x\n",
                                    'TUNABLES = {"A": (1,)}\nCONFIG = {"A": 1}\ndef toy(x):\n    return x\n',
                                    'TUNABLES = {"SPLIT": (1, 2)}\nCONFIG = {"SPLIT": 1}\ndef toy(x):\n    return x\n'],
                         ids=["no-tunables", "single-value", "only-frozen"])
def test_nothing_to_tune(source):
    with pytest.raises(NothingToPropose):
        make_proposer("tuner").propose(_ctx(source))


def test_tuner_on_the_library_rmsnorm():
    from pathlib import Path

    import tik_kernels.ops

    src = (Path(tik_kernels.ops.__file__).parent / "rmsnorm.py").read_text()
    p = make_proposer("tuner").propose(_ctx(src, contract={"entries": ["rmsnorm"], "frozen_tunables": []}))
    cfg = module_literal(p.source, "CONFIG")
    assert cfg != module_literal(src, "CONFIG")
    before = src.split("CONFIG = ")[0]
    assert p.source.startswith(before)
    assert p.source.split("\n", 1)[0] == src.split("\n", 1)[0]
    compile(p.source, "rmsnorm.py", "exec")


def test_every_library_root_gives_the_tuner_a_space():
    """Each root's TUNABLES and CONFIG are literals the tuner can read, with at least one free key: attention's
    once held `1 << 30`, which is not a literal, so the tuner saw no space and could not search attention."""
    from tik_kernels.contracts import all_contracts
    from tik_tui.agent.tuner import tunable_space

    for op, c in all_contracts().items():
        src = c.root_path.read_text()
        assert module_literal(src, "TUNABLES") is not None, op
        assert tunable_space(src, set(c.frozen_tunables))[1], op


def test_moves_whose_tiles_exceed_shared_memory_are_never_proposed():
    """A module's SMEM_TILES / SMEM_LIMIT: the tuner skips a config Triton would refuse (OutOfResources), and the
    figure agrees with what Triton asked for on the H200 (262208 bytes for 8 x (128 + 128) x 64 x 2, 64 of them its
    own)."""
    from tik_tui.agent.tuner import fits, smem_bytes

    tile = ("BM", "BN", "BK", "S", "U")
    assert smem_bytes({"BM": 128, "BN": 128, "BK": 64, "S": 8, "U": 1}, tile) == 262144
    assert smem_bytes({"BM": 128, "BK": 64, "S": 8, "U": 1}, tile) is None
    src = TOY_SOURCE.replace("CONFIG = ", 'SMEM_TILES = {"t": ("BLOCK", "BLOCK", "BLOCK", "num_warps", "SPLIT")}\n'
                             "SMEM_LIMIT = 65536\nCONFIG = ", 1)
    assert module_literal(src, "SMEM_TILES") and module_literal(src, "CONFIG")
    tuner, tried, seen = make_proposer("tuner"), {config_key(module_literal(src, "CONFIG"))}, []
    for p in _walk(tuner, src, tried):
        cfg = module_literal(p.source, "CONFIG")
        tried.add(config_key(cfg))
        seen.append((cfg["BLOCK"], cfg["num_warps"]))
    # warps x (2 BLOCK) x BLOCK x 2 bytes within 65536: BLOCK 64 up to 4 warps, BLOCK 128 with 1
    assert set(seen) | {(32, 4)} == ({(b, w) for b in (16, 32, 64, 128) for w in (1, 2, 4, 8)}
                                     - {(64, 8), (128, 2), (128, 4), (128, 8)})
    # the library's linear declares its tiles: its current CONFIG fits, the moves that failed on the H200 do not
    lin = (Path(__file__).resolve().parents[2] / "tik_kernels" / "ops" / "linear.py").read_text()
    tiles, limit, config = (module_literal(lin, k) for k in ("SMEM_TILES", "SMEM_LIMIT", "CONFIG"))
    assert fits(config, tiles, limit)
    assert not fits({**config, "M256_FILL_BLOCK_N": 128}, tiles, limit)
    assert not fits({**config, "MBIG_num_stages": 5}, tiles, limit)


def test_moves_of_a_key_behind_an_off_gate_are_never_proposed():
    """A module's TUNABLE_WHEN: a key only a gated path reads is moved only where its gate is on (with it, in a
    two-key move), never alone where nothing reads it: such a move would time its parent's launches again."""
    src = TOY_SOURCE.replace('"SPLIT": (1, 2)}', '"SPLIT": (1, 2), "FAST": (0, 1), "FAST_TILE": (1, 2, 3)}', 1)
    src = src.replace('"SPLIT": 1}', '"SPLIT": 1, "FAST": 0, "FAST_TILE": 2}\nTUNABLE_WHEN = {"FAST_TILE": '
                      '{"FAST": (1,)}}', 1)
    parent = module_literal(src, "CONFIG")
    assert module_literal(src, "TUNABLE_WHEN") and parent["FAST"] == 0
    tuner, tried, seen = make_proposer("tuner"), {config_key(parent)}, []
    for p in _walk(tuner, src, tried, limit=200):
        cfg = module_literal(p.source, "CONFIG")
        tried.add(config_key(cfg))
        seen.append(cfg)
    assert seen and all(c["FAST"] == 1 for c in seen if c["FAST_TILE"] != 2)
    assert {c["FAST_TILE"] for c in seen if c["FAST"] == 1} == {1, 2, 3}
    # every config where FAST_TILE matters was still reached: the filter drops only repeats of a launch
    assert len({(c["BLOCK"], c["num_warps"]) for c in seen if c["FAST"] == 0}) == 15


def test_library_gates_name_real_keys():
    """Each root's TUNABLE_WHEN names keys of its TUNABLES and gates of its CONFIG with values the gate may take, so
    a renamed key cannot leave a stale gate that hides moves; and at each root no move changes a key whose gate is
    off without turning the gate on."""
    import random

    from tik_kernels.contracts import all_contracts
    from tik_tui.agent.tuner import feasible_moves, live, tunable_space

    for op, c in all_contracts().items():
        src = c.root_path.read_text()
        when = module_literal(src, "TUNABLE_WHEN") or {}
        tunables, config = module_literal(src, "TUNABLES"), module_literal(src, "CONFIG")
        for key, cond in when.items():
            assert key in tunables and key in config, (op, key)
            for gate, values in cond.items():
                assert gate in config and set(values) <= set(tunables[gate]), (op, key, gate)
        config, space = tunable_space(src, set(c.frozen_tunables))
        dead = [k for k in when if k in space and not live(config, k, when)]
        if dead:
            moves = list(feasible_moves(src, config, space, random.Random(0)))
            for m in moves:
                for k in dead:
                    if m[k] != config[k]:
                        assert live(m, k, when), (op, k, m)
