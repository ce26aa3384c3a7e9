"""`screen()`: several variants timed beside their parent in one sandboxed child (CPU interpreter here)."""

from pathlib import Path

import tik_kernels.ops
from tik_kernels.evaluator.screen import screen
from tik_tui.agent.base import module_literal
from tik_tui.agent.tuner import rewrite_config

SRC = (Path(tik_kernels.ops.__file__).parent / "rmsnorm.py").read_text()


def test_screen_ranks_variants_and_names_the_broken_ones():
    cfg = module_literal(SRC, "CONFIG")
    variants = [rewrite_config(SRC, {**cfg, "TILE_ELEMS": 2048}),
                "raise RuntimeError('boom at import')\n",
                SRC.replace("def rmsnorm(", "def rmsnorm_renamed("),
                SRC]
    r = screen("rmsnorm", SRC, variants, device="cpu", rounds=2, timeout=120)
    assert r["failure"] is None and r["rounds"] == 2 and r["parent_objective"] > 0
    good, boom, renamed, same = r["results"]
    assert good["error"] is None and good["speedup"] > 0 and set(good["cells"]) == {
        "cpu/hidden[T=1,H=64]", "cpu/hidden[T=16,H=64]"}
    assert abs(good["objective"] * good["speedup"] - r["parent_objective"]) < 1e-6 * r["parent_objective"]
    assert boom["speedup"] is None and "import failed: RuntimeError: boom at import" in boom["error"]
    assert renamed["speedup"] is None and "entry point rmsnorm() missing" in renamed["error"]
    assert same["error"] is None and same["speedup"] > 0


def test_a_hanging_variant_fails_the_screen_not_the_caller():
    r = screen("rmsnorm", SRC, ["import time\ntime.sleep(600)\n"], device="cpu", rounds=1, timeout=2)
    assert r["failure"].startswith("screen: timed out") and r["results"][0]["speedup"] is None


def test_a_broken_parent_fails_the_screen():
    r = screen("rmsnorm", "raise SystemExit(3)\n", [SRC], device="cpu", rounds=1, timeout=60)
    assert r["failure"].startswith("screen: the parent")
