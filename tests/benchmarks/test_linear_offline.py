"""`linear_offline.tiles`, without compiling: every launch tile the linear root's CONFIG names (each bucket's, the FILL
tiles too: `linear.SMEM_TILES`), with its own K_UNROLL. Run in a subprocess: importing the tool turns the interpreter
off for the process, as it must before Triton is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import linear_offline
from tik_kernels.ops import linear as L
print(json.dumps([linear_offline.tiles(L.CONFIG), sorted(L.SMEM_TILES)]))
"""


def test_tiles_are_every_config_launch_tile():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tiles, buckets = json.loads(out.stdout)
    assert sorted(b for b, _ in tiles) == buckets
    from tik_kernels.ops import linear as L

    for b, (bm, bn, warps, stages, unroll) in tiles:
        assert (bm, bn, warps, stages) == tuple(L.CONFIG[f"{b}_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps",
                                                                              "num_stages"))
        assert unroll == L.CONFIG[f"{b.split('_')[0]}_K_UNROLL"]
