"""benchmarks/attn_fwd_timeline.py without a GPU: the instrumented copy of the forward compiles for sm_90 with its
timer reads, a forward the anchors no longer match is refused in one line, and the analysis recovers a known
timeline from planted records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import attn_fwd_timeline as T

ROOT = Path(__file__).resolve().parents[2]

COMPILE = r'''
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
import offline_compile as oc
import attn_fwd_timeline as T
from attn_ir_offline import POINTERS
from tik_kernels.contract import load_module
path = Path(tempfile.mkdtemp()) / "attention_timeline.py"
path.write_text(T.instrument(T.SOURCE.read_text()))
fn = load_module(path, "attention_timeline")._attn_fwd_kernel
const = dict(G=4, D=128, BLOCK_M=128, BLOCK_N=128, CHUNK=4, VARLEN=False, UPCAST=False, TOTAL_IN_MEMORY=False,
             TMA=False)
ptx = oc.compile_sm90(fn, const, POINTERS, dict(num_warps=8, num_stages=2, enable_fp_fusion=False),
                      default_type=lambda n: "i32", aligned=[]).asm["ptx"]
print(ptx.count("%clock64"), ptx.count("%globaltimer"), ptx.count("%smid"))
'''


def test_the_instrumented_forward_compiles_for_sm90_with_its_timer_reads():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["3", "2", "1"]  # start, unmasked end, end; start and end; the SM


def test_the_root_is_untouched_and_the_copy_records_into_the_unused_scratch():
    src = T.SOURCE.read_text()
    copy = T.instrument(src)
    assert "_probe" not in src and copy.count("_probe_put") > 10
    assert "scratch = _PROBE if _PROBE is not None else scratch" in copy
    compile(copy, "attention_timeline.py", "exec")


def test_a_forward_the_anchors_no_longer_match_is_refused_in_one_line():
    src = T.SOURCE.read_text().replace("    for j in range(n_in, n_blocks):\n",
                                       "    for jj in range(n_in, n_blocks):\n", 1)
    with pytest.raises(SystemExit) as e:
        T.instrument(src)
    assert "the masked loop" in str(e.value) and "\n" not in str(e.value)


def _planted(fixed_cycles=3000, block_cycles=2000, tail_cycles=5000, gap_cycles=500, ghz=1.5, sms=4, per_sm=6):
    """Records of a launch with one program at a time per SM, exactly this timeline (cycles), as the kernel writes
    them: int32 slots with 64-bit values in two words."""
    rows = []
    rng = np.random.default_rng(0)
    for sm in range(sms):
        c = 10**12 + sm * 777  # per-SM clocks, unrelated across SMs
        g = 5 * 10**15  # ns
        for i in range(per_sm):
            n_full = int(rng.integers(0, 9))
            c0, c1 = c, c + fixed_cycles + n_full * block_cycles
            c2 = c1 + tail_cycles
            g0, g2 = g, g + round((c2 - c0) / ghz)
            row = np.zeros(T.SLOTS, dtype=np.int64)
            for name, v in dict(c0=c0, c1=c1, c2=c2, g0=g0, g2=g2).items():
                i0 = T.FIELDS[name]
                row[i0], row[i0 + 1] = v & 0xFFFFFFFF, v >> 32
            row[T.SMALL["sm"]], row[T.SMALL["tile"]], row[T.SMALL["written"]] = sm, i, 1
            row[T.SMALL["n_first"]], row[T.SMALL["n_blocks"]] = n_full, n_full + 1
            rows.append(row)
            c, g = c2 + gap_cycles, g2 + round(gap_cycles / ghz)
    rows.append(np.zeros(T.SLOTS, dtype=np.int64))  # a program that returned early: never written
    return np.stack(rows).astype(np.uint32).view(np.int32)  # as the buffer's int32 view holds them


def test_analysis_recovers_the_planted_timeline():
    r = T.analyze(T.decode(_planted()))
    assert r["programs"] == 24 and r["sms"] == 4 and r["programs_per_sm_median"] == 6
    assert r["clock_ghz"] == pytest.approx(1.5, rel=1e-5)
    us = 1 / 1500  # a cycle at 1.5 GHz
    assert r["fixed_us"] == pytest.approx(3000 * us, rel=1e-5)
    assert r["block_us"] == pytest.approx(2000 * us, rel=1e-5)
    assert r["masked_and_end_us_median"] == pytest.approx(5000 * us, rel=1e-5)
    assert r["gap_us_median"] == pytest.approx(500 * us, rel=1e-5) and r["concurrency_max"] == 1
    assert 0.5 < r["sm_busy_median"] <= 1


def test_overlapping_programs_are_counted_as_concurrent_and_give_no_gaps():
    rec = T.decode(_planted(gap_cycles=-4000))  # each program starts before the one before it on its SM ends
    r = T.analyze(rec)
    assert r["concurrency_max"] == 2 and r["gap_us_median"] is None


def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "benchmarks/attn_fwd_timeline.py", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "needs a CUDA GPU" in out.stderr


def test_malformed_cells_are_refused_by_argparse(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/attn_fwd_timeline.py", "--out", str(tmp_path), "--cells",
                          "16by1024"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "--cells" in out.stderr.strip().splitlines()[-1]


def test_a_launch_count_below_one_is_refused_by_argparse(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/attn_fwd_timeline.py", "--out", str(tmp_path), "--launches",
                          "0"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "--launches" in out.stderr.strip().splitlines()[-1]


def test_a_malformed_set_is_refused_by_argparse(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/attn_fwd_timeline.py", "--out", str(tmp_path), "--set",
                          "FWD_ONE_LOOP"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "KEY=INTEGER" in out.stderr.strip().splitlines()[-1]


def test_the_report_renders_the_median_of_the_launches():
    runs = [T.analyze(T.decode(_planted(gap_cycles=g))) for g in (300, 500, 700)]
    row = {"cell": "prefill[B=1,S=1024]", **T._median_dicts(runs), "timed_us_root": 50.0, "timed_us_copy": 51.0}
    assert row["gap_us_median"] == pytest.approx(500 / 1500, rel=1e-3)
    meta = {"gpu": "planted", "command": "c", "driver": "d", "torch": "t", "triton": "3.6", "git_commit": "x",
            "date": "now", "copy_config": {"FWD_ONE_LOOP": 1}}
    md = T._markdown([row], meta)
    assert "| prefill[B=1,S=1024] | 24 | 6 | 1 |" in md and "50.0 / 51.0" in md and "FWD_ONE_LOOP" in md
