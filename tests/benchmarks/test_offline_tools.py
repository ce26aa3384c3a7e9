"""The offline compile tools' text parsing, without compiling: `attn_ir_offline.regions` (SASS instructions per
region of a kernel), `attn_ir_offline.inner_loops` and `offline_compile.plain_ptx`. Run in a subprocess: importing the
tools turns the interpreter off for the process, as they must before Triton is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: a kernel's SASS as nvdisasm prints it: 3 instructions, a loop of 4 (with a forward branch inside), 2, a loop of 3,
#: an EXIT, then an out-of-line retry that branches back into the first loop (not a loop of the main body)
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   CS2R R2, SRZ ;
.L_x_1:
        /*0030*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], R24 ;
        /*0040*/               @P1 BRA `(.L_x_2) ;
        /*0050*/                   FMUL R3, R3, R4 ;
.L_x_2:
        /*0060*/               @P0 BRA `(.L_x_1) ;
        /*0070*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0080*/                   ISETP.GE.AND P0, PT, R5, R6, PT ;
.L_x_3:
        /*0090*/                   FSEL R7, R7, -INF , P2 ;
        /*00a0*/                   MUFU.EX2 R8, R7 ;
        /*00b0*/               @P0 BRA `(.L_x_3) ;
        /*00c0*/                   STG.E [R10.64], R8 ;
        /*00d0*/                   EXIT ;
.L_x_9:
        /*00e0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R2+URZ], R3 ;
        /*00f0*/              @!P3 BRA `(.L_x_9) ;
        /*0100*/                   BRA `(.L_x_1) ;
"""

SCRIPT = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import attn_ir_offline, offline_compile
sass, ptx, nested = json.loads(sys.stdin.read())
print(json.dumps([attn_ir_offline.regions(sass), offline_compile.plain_ptx(ptx), attn_ir_offline.inner_loops(sass),
                  attn_ir_offline.inner_loops(nested)]))
"""

PTX = """.visible .entry k(
$L__tmp12:
\tadd.s32 \t%r1, %r2, 1; // a comment
\t.loc 1 10 5
$L__BB0_2:
\tbra.uni \t$L__BB0_2;
"""


#: a chunk loop (a spill store and load at its fold) around a block loop (a wgmma and a predicated spill load), then an
#: EXIT and an out-of-line retry whose backward branch is no loop of the body
NESTED = """
.L_x_1:
        /*0000*/                   STL [R1+0x10], R4 ;
.L_x_2:
        /*0010*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], R24 ;
        /*0020*/               @P1 LDL R5, [R1+0x14] ;
        /*0030*/               @P0 BRA `(.L_x_2) ;
        /*0040*/                   LDL.64 R6, [R1+0x10] ;
        /*0050*/               @P2 BRA `(.L_x_1) ;
        /*0060*/                   EXIT ;
.L_x_9:
        /*0070*/                   STL [R1], R2 ;
        /*0080*/                   BRA `(.L_x_9) ;
"""


def test_regions_inner_loops_and_plain_ptx():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps([SASS, PTX, NESTED]), capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    regions, plain, inner, nested = json.loads(out.stdout)
    # the main body's loops that hold no other: (instructions, spill stores, spill loads, wgmmas)
    assert inner == [[4, 0, 0, 1], [3, 0, 0, 0]]
    assert nested == [[3, 0, 1, 1]]
    assert regions == [["before the first loop", 3], ["loop 1", 4], ["between loops 1 and 2", 2], ["loop 2", 3],
                       ["after the last loop", 2]]
    # the debug-only label and the line marker go, a branch target and the code stay (comments cut)
    assert plain.splitlines() == [".visible .entry k(", "\tadd.s32 \t%r1, %r2, 1;", "$L__BB0_2:",
                                  "\tbra.uni \t$L__BB0_2;"]


KERNELS = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import lmhead_ptx_offline as lo, offline_compile as oc
names = [(op, k) for op, k, *_ in lo.CASES + lo.COMBINES] + [("_lmhead", k) for k in lo.BACKWARD_KERNELS]
print(json.dumps([[op, k, hasattr(oc.kernel(oc.op_path(op), k), "fn")] for op, k in names]))
"""


def test_lmhead_offline_names_kernels_that_exist():
    """Every kernel `lmhead_ptx_offline.py` compiles is where it looks for it (its --backward looked for the grad
    kernels in logprob.py for three sessions after they moved to _lmhead.py, and failed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", KERNELS], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found and all(ok for *_, ok in found), found


def test_rope_offline_compiles_the_launches_constexprs():
    """`offline_compile.signature` drops a constexpr the kernel does not take (an older revision's), so a renamed one
    would silently compile another kernel: every one `rope_offline` sets is a parameter of its kernel, and the fused
    kernel's tile is rmsnorm's own."""
    script = r"""
import inspect, json, sys
sys.path.insert(0, "benchmarks")
import rope_offline
from tik_kernels.ops import rmsnorm
out = [sorted(set(const) - set(inspect.signature(fn.fn).parameters)) for _, fn, const, _, _ in rope_offline.cases()]
fused = [(c["BLOCK_R"], c["BLOCK_H"], w) for n, _, c, w, _ in rope_offline.cases() if "norms" in n]
print(json.dumps([out, fused, list(rmsnorm._tile(rope_offline.HEAD_DIM))]))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    unknown, fused, tile = json.loads(res.stdout.strip().splitlines()[-1])
    assert unknown == [[]] * len(unknown)
    assert fused and all(list(f) == tile for f in fused)
