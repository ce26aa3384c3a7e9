"""Shared by the evaluator's tests: the fixtures directory and the tiny test-only contract."""

from __future__ import annotations

import sys
from pathlib import Path

from tik_kernels.contract import Contract, load_module

FIX = Path(__file__).with_name("fixtures")


def tiny() -> Contract:
    """The test-only contract (fixtures/tiny_contract.py), registered once in sys.modules."""
    if "tiny_contract" not in sys.modules:
        sys.modules["tiny_contract"] = load_module(FIX / "tiny_contract.py", "tiny_contract")
    return sys.modules["tiny_contract"].CONTRACT
