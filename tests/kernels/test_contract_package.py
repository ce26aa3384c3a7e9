"""tik_kernels/contract/, one module per job: every name the repo imports from it is still there, and the
contract fingerprint, the evaluator's fingerprint and its integrity hashes cover every module of it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import tik_kernels.contract as contract_pkg
from tik_kernels.contract import Contract, load_module, spec
from tik_kernels.contracts import get_contract
from tik_kernels.evaluator import integrity, report

REPO = Path(__file__).resolve().parents[2]
PKG = Path(contract_pkg.__file__).resolve().parent
MODULES = sorted(PKG.glob("*.py"))
#: the shared plan pieces of the token-wise contracts: a fingerprint must follow them too
COMMON = PKG.parent / "contracts" / "_common.py"


def _names_imported_from_the_package() -> set[str]:
    names = set()
    for folder in ("tik_kernels", "tik_store", "tik_tui", "tests", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == "tik_kernels.contract":
                    names.update(a.name for a in node.names)
    return names


def test_every_name_the_repo_imports_is_exported():
    names = _names_imported_from_the_package() - {p.stem for p in MODULES}  # `from tik_kernels.contract import spec`
    assert {"Contract", "Plan", "run_plan", "load_module", "tokenwise_plan", "same_bits"} <= names  # the scan works
    assert names <= set(contract_pkg.__all__), sorted(names - set(contract_pkg.__all__))
    assert all(hasattr(contract_pkg, n) for n in contract_pkg.__all__)


def _edited(monkeypatch, target: Path) -> None:
    """Every later read of `target` sees one more line, as if someone had edited it."""
    real = Path.read_bytes

    def read_bytes(self):
        data = real(self)
        return data + b"\n# edited\n" if self.resolve() == target else data

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


@pytest.mark.parametrize("path", [*MODULES, COMMON], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fingerprint_changes_with_every_module_of_the_framework(monkeypatch, path):
    c = get_contract("rmsnorm")  # a token-wise contract: it uses _common.py
    before = c.fingerprint()
    _edited(monkeypatch, path)
    assert c.fingerprint() != before, f"{path.name} is not in the fingerprint"


def test_a_fingerprint_that_skips_the_framework_is_caught(monkeypatch):
    # the check above, against a fingerprint that hashes the contract's own file only
    monkeypatch.setattr(spec, "reached_sources", lambda starts: [Path(p).resolve() for p in starts[:1]])
    c = get_contract("rmsnorm")
    before = c.fingerprint()
    _edited(monkeypatch, PKG / "runner.py")
    assert c.fingerprint() == before


def test_integrity_and_evaluator_fingerprint_cover_every_module(monkeypatch):
    trusted = integrity.digests()
    assert {f"contract/{p.name}" for p in MODULES} <= trusted.keys(), sorted(trusted)
    before = report.evaluator_fingerprint.__wrapped__()
    _edited(monkeypatch, PKG / "tokenwise.py")
    assert report.evaluator_fingerprint.__wrapped__() != before


def test_the_old_trusted_list_would_miss_the_package(monkeypatch):
    monkeypatch.setattr(integrity, "TRUSTED", tuple("contract.py" if t == "contract/*.py" else t
                                                    for t in integrity.TRUSTED))
    assert not any(k.startswith("contract/") for k in integrity.digests())


def test_a_contract_loads_by_path_as_the_timing_child_loads_it():
    c = get_contract("rmsnorm")
    mod = load_module(inspect.getfile(c.build_plan), "tik_contract")
    assert isinstance(mod.CONTRACT, Contract) and mod.CONTRACT is not c
    assert mod.CONTRACT.fingerprint() == c.fingerprint()


def test_the_architecture_map_names_every_module():
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    missing = [p.name for p in MODULES if p.name != "__init__.py" and f"  {p.name}  " not in doc]
    assert not missing, f"docs/ARCHITECTURE.md's map lacks tik_kernels/contract/{missing}"
