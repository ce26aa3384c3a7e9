"""`sweep_cells.py` reads sweeps already run: per cell the entry point's ratio and the best candidate's, per bucket
both geomeans, and a one-line error for a folder with no sweep.json."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sweep_cells as SC  # noqa: E402


def _sweep(tmp_path: Path) -> Path:
    d = tmp_path / "linear_sweep_x"
    d.mkdir()
    cells = [
        # the entry point 1.1x, a candidate 0.9x: a cell the bucket's single launch would give away
        {"proj": "o", "M": 1024, "N": 4096, "K": 4096, "bucket": "M1024", "cublas_us": 10.0, "linear_us": 11.0,
         "us": {"linear": 11.0, "128,128,8,5,1,0": 11.2, "128,256,8,4,1,0": 9.0}},
        {"proj": "qkv", "M": 16, "N": 6144, "K": 4096, "bucket": "M16", "cublas_us": 20.0, "linear_us": 20.0,
         "us": {"linear": 20.0, "16,64,4,4,2,4,fused": 20.0, "16,32,4,6,2,0": 21.0}},
    ]
    (d / "sweep.json").write_text(json.dumps({"cells": cells, "command": "sweep", "env": {"gpu": "X"}}))
    return d


def test_the_best_launch_of_each_cell_and_the_geomeans(tmp_path, capsys):
    d = _sweep(tmp_path)
    rows = SC.cells(json.loads((d / "sweep.json").read_text()))
    assert [(r["best"], round(r["best_ratio"], 3), round(r["linear"], 3)) for r in rows] == [
        ("128,256,8,4,1,0", 0.9, 1.1), ("16,64,4,4,2,4,fused", 1.0, 1.0)]
    out = tmp_path / "r.md"
    assert SC.main([str(d), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| o M=1024 (N=4096, K=4096) | M1024 | 1.100 | 128,256,8,4,1,0 | 0.900 | 0.818 |" in text
    assert f"| all | 2 | {math.sqrt(1.1):.3f} | {math.sqrt(0.9):.3f} |" in text
    assert "| M <= 16 | 1 | 1.000 | 1.000 |" in text


def test_a_folder_without_a_sweep_is_one_line(tmp_path, capsys):
    assert SC.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"sweep_cells: no sweep.json in {tmp_path}"


def test_a_file_that_is_no_sweep_is_one_line(tmp_path, capsys):
    for text in ("not json", '{"cells": [{"proj": "o"}]}'):
        (tmp_path / "sweep.json").write_text(text)
        assert SC.main([str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"sweep_cells: {tmp_path / 'sweep.json'} is not a sweep_linear.py sweep.json (")
        assert "\n" not in err
