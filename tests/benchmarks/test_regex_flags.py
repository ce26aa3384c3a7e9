"""The benchmarks' name filters (`bench_lmhead_decode.py --only`, `bench_attn_bwd.py --configs`) take a regular
expression: a malformed one is a one-line argparse error and exit status 2, before any GPU work."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "flag"), [("bench_lmhead_decode.py", "--only"), ("bench_attn_bwd.py", "--configs")])
def test_a_malformed_filter_is_one_clear_error(tmp_path, script, flag):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), flag, "(", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert f"argument {flag}: not a regular expression: '('" in r.stderr
    assert "Traceback" not in r.stderr
