"""Holes a reward-hacking candidate would find in the contract, each closed: a planted candidate per hole,
rejected with its reason in the report (CPU; the tiny contract or a torch-only candidate, so no interpreter)."""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import torch.nn.functional as F
from evaluator_fixtures import FIX, tiny

from tik_kernels.contract import reached_sources, run_plan
from tik_kernels.contracts import all_contracts, get_contract
from tik_kernels.evaluator import evaluate

PKG = Path(inspect.getfile(get_contract)).resolve().parent.parent


def _failed(rep) -> dict[str, str]:
    return {c.name: c.detail for c in rep.checks if not c.passed}


# ----------------------------------------------------------------------------- grad mode


def test_forward_with_grad_enabled_must_have_the_no_grad_bits():
    rep = evaluate("silu_mul", FIX / "grad_mode_switch.py", device="cpu", time_it=False, timeout=60)
    assert not rep.verified
    bad = _failed(rep)
    assert bad and all(k.startswith("grad_mode_invariance[") for k in bad), bad
    assert "forward with grad enabled differs from no_grad" in rep.failure


def test_an_honest_forward_passes_the_grad_mode_check():
    def silu_mul(x):
        gate, up = x.float().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype)

    mod = types.ModuleType("honest")
    mod.silu_mul = silu_mul
    results = run_plan(get_contract("silu_mul").plan("cpu", 0), mod)
    mode = [r for r in results if r.requirement == "grad_mode_invariance"]
    assert mode and all(r.passed for r in mode), [r.detail for r in mode if not r.passed]


def test_every_training_operator_gets_the_check():
    for op, c in all_contracts().items():
        if op in ("linear", "attention"):  # their GPU-sized CPU plans are built in their own tests
            continue
        names = {r.name for r in c.requirements}
        checks = {k.requirement for k in c.plan("cpu", 0).checks}
        assert ("grad_mode_invariance" in checks) == c.used_in_training, op
        assert ("grad_mode_invariance" in names) == c.used_in_training, op


# ----------------------------------------------------------------------------- fingerprint


def test_fingerprint_covers_every_frozen_module_a_contract_reaches():
    for op, extra in (("rmsnorm", ["contracts/_common.py", "reference/rmsnorm.py"]),
                      ("logprob", ["contracts/_lmhead.py", "reference/logprob.py"]),
                      ("attention", ["reference/attention.py"])):
        mod = inspect.getmodule(get_contract(op).build_plan)
        got = {str(p.relative_to(PKG)) for p in reached_sources([Path(mod.__file__), PKG / "contract" / "__init__.py"])}
        assert {f"contracts/{op}.py", "contract/spec.py", "models.py", *extra} <= got, (op, got)
        assert not any(p.startswith(("ops/", "evaluator/")) for p in got), got


def test_fingerprint_changes_with_a_reached_module(monkeypatch):
    c = get_contract("rope")
    before = c.fingerprint()
    ref = PKG / "reference" / "rope.py"
    real = Path.read_bytes

    def edited(self):
        data = real(self)
        return data + b"\n# edited\n" if self == ref else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    assert c.fingerprint() != before


# ----------------------------------------------------------------------------- runtime import guard


def test_an_obfuscated_import_of_the_harness_is_refused_at_run_time():
    rep = evaluate(tiny(), FIX / "obfuscated_import.py", root_path=FIX / "tiny_root.py", device="cpu", time_it=True,
                   timeout=20)
    assert not rep.verified
    assert "may not import tik_kernels.evaluator" in rep.failure, rep.failure
    assert not rep.cells  # never timed

