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


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="no bash or timeout")
def test_a_part_cut_short_still_leaves_an_archive(tmp_path):
    """A call stopped at its time limit in the middle of a part brings back what the part wrote so far: the archive
    is made every PACK_EVERY seconds while a part runs, not only when it ends (session 40 lost a scale-out run)."""
    import os
    import signal
    import tarfile

    fake = tmp_path / "python"  # a "python" whose every run outlasts the call, standing in for a long benchmark
    fake.write_text("#!/bin/sh\n[ \"$1\" = -c ] && { echo cpu; exit 0; }\necho 'rows so far'\nexec sleep 30\n")
    fake.chmod(0o755)
    r, pack = tmp_path / "r", tmp_path / "r.tgz"
    env = {**os.environ, "PYTHON": str(fake), "R": str(r), "PACK": str(pack), "PACK_EVERY": "1"}
    proc = subprocess.Popen(["timeout", "4", "bash", str(SCRIPT), "rvi"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.wait(timeout=60) == 124  # the call's limit, not the part's end
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the part's own process, orphaned by the call's end
    with tarfile.open(pack) as tar:
        log = tar.extractfile("./rvi.log").read().decode()
    assert "rows so far" in log
    assert not list(tmp_path.glob("r.tgz.*")), "an archive made aside was left behind"
