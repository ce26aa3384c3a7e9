"""`ptx_unchanged.canonical`, without compiling: PTX whose registers were only renumbered compares equal, a change of
dataflow or of an operation does not, special registers stay. Run in a subprocess: importing the tool turns the
interpreter off for the process, as it must before Triton is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import ptx_unchanged
texts = json.loads(sys.stdin.read())
print(json.dumps([[ptx_unchanged.canonical(t) for t in texts], [ptx_unchanged.declared(t) for t in texts]]))
"""

PTX = """\t.reg .pred \t%p<3>;
\t.reg .b32 \t%r<8>;
\t.reg .b64 \t%rd<4>;
\tmov.u32 \t%r1, %tid.x;
\tmov.u32 \t%r2, %ctaid.x;
\tmov.u64 \t%rd1, %clock64;
\tmad.lo.s32 \t%r3, %r2, 128, %r1;
\tsetp.lt.s32 \t%p1, %r3, 4096;
\tmul.wide.s32 \t%rd2, %r3, 4;
\tadd.s64 \t%rd3, %rd2, %rd1;
\t@%p1 ld.global.b32 \t%r4, [ %rd3 + 0 ];
\tadd.f32 \t%r5, %r4, %r4;
\tfma.rn.f32 \t%r6, %r5, %r4, %r3;
\tst.global.b32 \t[ %rd3 + 0 ], %r6;
\tret;"""

#: the same kernel, its registers renumbered throughout (a permutation within each class) and declared otherwise
RENUMBERED = (PTX.replace("%r<8>", "%r<20>").replace("%rd<4>", "%rd<9>")
              .replace("%r1,", "%r11,").replace("%r1;", "%r11;")
              .replace("%r2", "%r17").replace("%r3", "%r12").replace("%r4", "%r19").replace("%r5", "%r14")
              .replace("%r6", "%r13").replace("%rd1", "%rd8").replace("%rd2", "%rd5").replace("%rd3", "%rd2")
              .replace("%p1", "%p2"))
#: one register's two uses become two registers: `add` reads %r4 and a register nothing wrote (another dataflow)
SPLIT = PTX.replace("add.f32 \t%r5, %r4, %r4;", "add.f32 \t%r5, %r4, %r7;")
#: two registers merged into one: `fma` adds %r5 where it added %r3 (a renaming that is not one to one)
MERGED = PTX.replace("fma.rn.f32 \t%r6, %r5, %r4, %r3;", "fma.rn.f32 \t%r6, %r5, %r4, %r5;")
#: one operation changed, the registers as they were
OPCODE = PTX.replace("add.f32", "sub.f32")
#: the special registers swapped: the same shape, other values
SPECIALS = PTX.replace("%tid.x", "%TID").replace("%ctaid.x", "%tid.x").replace("%TID", "%ctaid.x")


def run(*texts: str) -> tuple[list[str], list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(texts), capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_canonical_register_numbering():
    assert RENUMBERED != PTX and "%r17" in RENUMBERED and "%rd8" in RENUMBERED
    (base, renumbered, split, merged, opcode, specials), counts = run(PTX, RENUMBERED, SPLIT, MERGED, OPCODE,
                                                                      SPECIALS)
    assert renumbered == base
    assert split != base and merged != base and opcode != base and specials != base
    lines = base.splitlines()
    # the declarations go, registers are named by class in order of first appearance, special registers stay
    assert not any(".reg" in ln for ln in lines)
    assert lines[0] == "\tmov.u32 \t%r_1, %tid.x;"
    assert lines[1] == "\tmov.u32 \t%r_2, %ctaid.x;"
    assert lines[2] == "\tmov.u64 \t%rd_1, %clock64;"
    assert lines[-3] == "\tfma.rn.f32 \t%r_6, %r_5, %r_4, %r_3;"
    assert counts[0] == {"p": 3, "r": 8, "rd": 4} and counts[1] == {"p": 3, "r": 20, "rd": 9}


AT_REV = r"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
import ptx_unchanged
tmp = Path(tempfile.mkdtemp())
made = {}
src = ptx_unchanged.at_rev("HEAD", "logprob", tmp, made)
print(json.dumps({"src": src, "made": made, "files": sorted(p.name for p in tmp.iterdir()),
                  "lmhead": (tmp / "rev_ops_lmhead.py").read_text()}))
"""


def test_a_revisions_operator_imports_the_shared_modules_at_that_revision():
    """`at_rev`: logprob at HEAD imports `_lmhead`, `_common`, entropy and sample as they are at HEAD (written beside
    it), not this tree's, and those modules' own operator imports are pointed there too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", AT_REV], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert "tik_kernels.ops." not in doc["src"]
    assert "from rev_ops_lmhead import" in doc["src"] and "from rev_ops_common import" in doc["src"]
    assert {"_lmhead", "_common", "entropy", "sample"} <= set(doc["made"])
    assert {"rev_ops_lmhead.py", "rev_ops_common.py", "rev_ops_entropy.py", "rev_ops_sample.py"} <= set(doc["files"])
    assert "from rev_ops_common import" in doc["lmhead"] and "tik_kernels.ops." not in doc["lmhead"]
