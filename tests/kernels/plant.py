"""What the kernel tests' planted-bug cases share: a root's source with edits loaded as a fresh module (as a
candidate is loaded), and the failed checks of a plan's results, by name or by requirement."""

from __future__ import annotations

from pathlib import Path

from tik_kernels.contract import load_module


def failed(results) -> dict[str, str]:
    """{check name: detail} of the checks that failed."""
    return {r.name: r.detail for r in results if not r.passed}


def failed_requirements(results) -> set[str]:
    """The requirements at least one failed check belongs to."""
    return {r.requirement for r in results if not r.passed}


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
