"""Head dim 256 on an H200: the CONFIG's launches (128-key K and V tiles of 64 KB each) would ask for more shared
memory than the GPU has; `_for_head_dim` picks smaller ones. Checked by compiling for sm_90 on the CPU
(benchmarks/attn_ir_offline.py --head-dim): every launch the host makes fits, and without the clamp some do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tik_kernels" / "ops" / "attention.py"


def _offline(head_dim: int, source: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attn_ir_offline.py"), "--head-dim",
                           str(head_dim), "--source", str(source)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


@pytest.mark.parametrize("head_dim", [128, 256])
def test_every_launch_fits_an_h200(head_dim):
    out = _offline(head_dim, SOURCE)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("[fits]") == 7, out.stdout


def test_without_the_clamp_head_dim_256_does_not_fit(tmp_path):
    src = SOURCE.read_text()
    old = "    if d <= _WIDE_HEAD or INTERPRET:\n        return cfg\n"
    assert src.count(old) == 1
    planted = tmp_path / "attention_no_clamp.py"
    planted.write_text(src.replace(old, "    return cfg\n"))
    out = _offline(256, planted)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    over = [line.split(",")[0] for line in out.stdout.splitlines() if "OVER" in line]
    assert {"forward", "decode", "dq kernel"} <= set(over), out.stdout
