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
def test_smoke_drops_a_form_that_hangs_and_tries_the_ones_after_it(tmp_path):
    """`smoke` (the prefill_ws part's guard): a variant whose launch never returns is left out, the variants after it
    run again in a fresh process, one that raised is left out, the rest reach the timing. A fake interpreter stands in
    for launch_smoke.py: it prints a line per variant as launch_smoke does, and sleeps on those named hang*."""
    fake = tmp_path / "fakepy"
    fake.write_text('#!/usr/bin/env bash\nshift\nfor spec in "$@"; do n=${spec%%=*}; case $n in\n'
                    '  hang*) sleep 60 ;;\n  bad*) echo "$n: raised RuntimeError: x" ;;\n'
                    '  *) echo "$n: ran in 1.0 s, the root bits" ;;\nesac; done\n')
    fake.chmod(0o755)
    func = re.search(r"^smoke\(\) \{.*?^\}$", SCRIPT.read_text(), re.S | re.M).group(0)
    specs = "a=attention.X=1 hang1=attention.X=1 b=attention.X=2 bad=attention.X=1 hang2=attention.X=1 c=attention.X=3"
    script = (f'set -u\nR={tmp_path}\npy={fake}\n{func}\nsmoke 2 {specs} >/dev/null\n'
              'echo "hung=$SMOKE_HUNG"\nprintf "%s\\n" "${SMOKED[@]/#/--variant=}"\n')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["hung=2", "--variant=a=attention.X=1", "--variant=b=attention.X=2", "--variant=c=attention.X=3"]
    log = (tmp_path / "launch_smoke.log").read_text()
    assert "hang1: no line" in log and "hang2: no line" in log and "bad: raised" in log
