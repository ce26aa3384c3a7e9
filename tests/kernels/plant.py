"""What the kernel tests' planted-bug cases share: a root's source with edits loaded as a fresh module (as a
candidate is loaded), and the failed checks of a plan's results, by name or by requirement."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tik_kernels.contract import load_module


def failed(results) -> dict[str, str]:
    """{check name: detail} of the checks that failed."""
    return {r.name: r.detail for r in results if not r.passed}


def failed_requirements(results) -> set[str]:
    """The requirements at least one failed check belongs to."""
    return {r.requirement for r in results if not r.passed}


def own_copy(src: str, module: str) -> str:
    """`src` with its `from <module> import ...` line replaced by that module's code (docstring and future import
    dropped): the root as a candidate that edits a shared piece would write it, owning its copy. The module's
    definitions come before the root's own, so an edit applied once lands in the shared piece where the root's code
    calls it."""
    line = re.search(rf"^from {re.escape(module)} import [^\n]*\n", src, flags=re.M)
    assert line, f"{module} is not imported by this source"
    body = Path(importlib.import_module(module).__file__).read_text()
    body = re.sub(r'\A""".*?"""\n', "", body, flags=re.S).replace("from __future__ import annotations\n", "")
    return src[: line.start()] + body + src[line.end():]


def planted(tmp_path: Path, src: str, name: str, *edits: tuple[str, str], config: dict | None = None):
    """`src` with each `old -> new` edit applied once (each must apply), written to tmp_path/<name>.py and loaded
    as a fresh module, its CONFIG updated with `config`."""
    for old, new in edits:
        assert old in src, f"planted edit no longer applies: {old!r}"
        src = src.replace(old, new, 1)
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    mod = load_module(path, name)
    if config:
        mod.CONFIG.update(config)
    return mod


def assert_caught(results, requirement: str) -> None:
    """A planted bug's plan results: some check of `requirement` failed; a numerics bug (accuracy, gradient) that
    keeps every row independent of the batch must not trip batch invariance as well."""
    missed = failed_requirements(results)
    assert requirement in missed, failed(results)
    if requirement in ("accuracy", "gradient"):
        assert "batch_invariance" not in missed, failed(results)


def assert_gpu_plan_passes(op: str, module) -> None:
    """`op`'s GPU plan run on `module` on CUDA: every check printed, every one passed."""
    from tik_kernels.contract import run_plan
    from tik_kernels.contracts import get_contract

    results = run_plan(get_contract(op).plan("gpu", seed=0), module, device="cuda")
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.detail}")
    assert results and not failed(results), failed(results)
