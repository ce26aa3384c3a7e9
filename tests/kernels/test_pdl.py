"""Programmatic dependent launch (`PDL`, tik_kernels/ops/_common.py): a launch option each decode-step operator may
take, never a bit change. The GPU's bits with it on are tests/e2e/test_decode_graphs_gpu.py's."""

from __future__ import annotations

import importlib

import pytest
import torch

from tik_kernels.e2e.backends import NO_PDL_CONFIG, PDL_PREFETCH_CONFIG, config_overrides
from tik_kernels.ops import _common


def test_every_decode_operator_launches_with_pdl_by_default_and_without_the_prefetch():
    for op, kv in PDL_PREFETCH_CONFIG.items():
        mod = importlib.import_module(f"tik_kernels.ops.{op}")
        for key in kv:
            assert mod.TUNABLES[key] == (0, 1), op
            assert mod.CONFIG[key] == (0 if key == "PREFETCH" else 1), (op, key)


def test_no_pdl_without_a_hopper_gpu(monkeypatch):
    assert _common.pdl_launch(1, torch.device("cpu")) == {}
    assert _common.pdl_launch(0, torch.device("cpu")) == {}
    monkeypatch.setattr(_common, "pdl_capable", lambda device: True)
    assert _common.pdl_launch(1, torch.device("cpu")) == {"PDL": True, "launch_pdl": True}
    assert _common.pdl_launch(0, torch.device("cpu")) == {}


def test_config_overrides_are_restored_even_on_error():
    lin = importlib.import_module("tik_kernels.ops.linear")
    with pytest.raises(RuntimeError), config_overrides(NO_PDL_CONFIG):
        assert lin.CONFIG["PDL"] == 0
        raise RuntimeError
    assert lin.CONFIG["PDL"] == 1


def test_a_pdl_launch_asks_for_the_option(monkeypatch):
    """With PDL asked and the device able, the kernel gets PDL=True and Triton launch_pdl=True (here recorded, not run:
    the interpreter has neither instruction)."""
    lin = importlib.import_module("tik_kernels.ops.linear")
    seen = {}

    class Launch:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                seen.update(kwargs)
            return run

    monkeypatch.setattr(lin, "pdl_launch", lambda on, device: {"PDL": True, "launch_pdl": True} if on else {})
    monkeypatch.setattr(lin, "_linear_fwd_kernel", Launch())
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    with config_overrides({"linear": {"PDL": 0}}):
        lin._matmul(x, w)
    assert "launch_pdl" not in seen
    lin._matmul(x, w)
    assert seen["launch_pdl"] is True and seen["PDL"] is True


def test_the_prefetch_stays_off_in_the_interpreter():
    """PTX's prefetch has no interpreter counterpart: asked for on the CPU, the launch leaves it out."""
    lin = importlib.import_module("tik_kernels.ops.linear")
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    want = lin._matmul(x, w)
    with config_overrides({"linear": {"PREFETCH": 1, "PDL": 1}}):
        assert torch.equal(lin._matmul(x, w).view(torch.int16), want.view(torch.int16))
