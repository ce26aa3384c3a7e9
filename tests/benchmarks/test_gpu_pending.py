"""benchmarks/gpu_pending.sh: its header, its `case` and its unknown-part message name the same parts, and it parses.

The script is how a GPU session runs the open issues' work; a part added to the case but not to the header (or the
other way round) is a part nobody finds, or one a reader asks for and the script refuses."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_pending.sh"


def _parts() -> tuple[set[str], set[str], set[str]]:
    """(parts the header documents, the case's labels, the names the unknown-part message lists; `X_OP` stands for
    X_rmsnorm, X_attention and X_linear)."""
    text = SCRIPT.read_text()
    header = text.split("\nset -u", 1)[0]
    doc = set()
    for names in re.findall(r"^#   ([a-z]\w*(?:, [a-z]\w*)*)(?=\s|$)", header, re.M):
        doc |= set(names.split(", "))
    cases = {n.strip() for m in re.findall(r"^ {8}([\w |]+)\)\s*$", text, re.M) for n in m.split("|")}
    listed = set()
    for n in re.search(r"unknown part \$p \(([^)]*)\)", text).group(1).split():
        ops = ("rmsnorm", "attention", "linear") if n.endswith("_OP") else ("OP",)
        listed |= {n.replace("_OP", f"_{op}") for op in ops}
    return doc, cases, listed


def test_every_part_is_documented_handled_and_listed():
    doc, cases, listed = _parts()
    assert cases, "no case labels found"
    assert doc == cases, (sorted(doc - cases), sorted(cases - doc))
    assert listed == cases, (sorted(listed - cases), sorted(cases - listed))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
