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
