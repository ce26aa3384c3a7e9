"""tik_kernels.contract.load_module: how implementation and contract files are imported by path."""

from __future__ import annotations

import sys

import pytest

from tik_kernels.contract import load_module


def test_module_is_registered_while_its_body_runs(tmp_path):
    # Python 3.12's dataclasses resolves string annotations through sys.modules[cls.__module__]:
    # on the H200 every linear timing child died in contracts/linear.py's dataclass before this
    f = tmp_path / "impl.py"
    f.write_text("import sys\nassert sys.modules[__name__].__dict__ is globals()\nVALUE = 3\n")
    a = load_module(f, "tik_test_registered")
    b = load_module(f, "tik_test_registered")
    assert a.VALUE == b.VALUE == 3 and a is not b  # a fresh module object each call
    assert "tik_test_registered" not in sys.modules  # registered only while its body ran


def test_a_failing_module_is_not_left_registered(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match="boom"):
        load_module(f, "tik_test_failing")
    assert "tik_test_failing" not in sys.modules
