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
print(json.dumps([linear_offline.tiles(L.CONFIG), sorted(L.SMEM_TILES),
                  {b: linear_offline.forms(b, tuple(t)) for b, t in linear_offline.tiles(L.CONFIG)}]))
"""


def test_tiles_are_every_config_launch_tile():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tiles, buckets, forms = json.loads(out.stdout)
    assert sorted(b for b, _ in tiles) == buckets
    from tik_kernels.ops import linear as L

    for b, (bm, bn, warps, stages, unroll) in tiles:
        assert (bm, bn, warps, stages) == tuple(L.CONFIG[f"{b}_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps",
                                                                              "num_stages"))
        assert unroll == L.CONFIG[f"{b.split('_')[0]}_K_UNROLL"]

    # what each tile is compiled as: the running total and ONE_CHUNK; swapped (with the tile's K_UNROLL and with 1) in
    # a bucket with a SWAP key; K_UNROLL 2 for a wgmma tile of K_UNROLL 1, its stages within the shared memory limit
    for b, tile in tiles:
        got = [(one, swap, tuple(t)) for one, swap, t in forms[b]]
        tile = tuple(tile)
        assert got[:2] == [(False, False, tile), (True, False, tile)], b
        swapped = [t for one, swap, t in got if swap]
        if f"{b.split('_')[0]}_SWAP" in L.TUNABLES:
            assert swapped[0] == tile and swapped[-1] == tile[:4] + (1,), b
        else:
            assert not swapped, b
        unrolled = [t for one, swap, t in got[2:] if not swap]
        if tile[0] >= 64 and tile[4] == 1:
            (bm, bn, warps, stages, unroll), = unrolled
            assert (bm, bn, warps, unroll) == tile[:3] + (2,) and 2 <= stages <= tile[3]
            assert stages * (bm + bn) * L.CONFIG["BLOCK_K"] * 2 * 2 <= L.SMEM_LIMIT or stages == 2
        else:
            assert not unrolled, b
