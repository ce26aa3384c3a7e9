"""Where the prefill forward's time goes, program by program: a timeline read from inside the kernel, on a GPU.

    PYTHONPATH=. python benchmarks/attn_fwd_timeline.py --out benchmarks/results [--name _sNN] [--cells 16x1024 ...]

Session 26 left the forward 1.04-1.19x SDPA flash at S = 1024 and 0.88x at 16k, about 1.6 us a 128-key block more at
the short length (4.4 against 2.8), and a guess: a fixed cost per program, with one program on an SM at a time. This
measures it instead of guessing. A copy of the attention root (`instrument`, in a temporary file: the root is not
touched) reads the SM's cycle counter (%clock64) and the global timer (%globaltimer) at three points of every forward
program: its start, the end of its first loop (the unmasked blocks, through TMA; with FWD_ONE_LOOP the diagonal blocks
inside the sequence too), and after its last store; it writes them with its SM
(%smid), row tile and block counts into the scratch the root leaves unused (TOTAL_IN_MEMORY off). The copy's outputs
are checked bit for bit against the root's. Per cell (`analyze`):
- a program's fixed cost and a block's: least squares of the time from its start to the end of its first loop over
  the blocks it walked (intercept: the Q load and setup; slope: one block), and the median time from there to
  its end (the masked diagonal blocks, the last merge, the normalization and the stores);
- the SMs: programs each, how many ran on one SM at once, the gap from one program's end to the next one's start on the
  same SM, and the busy fraction of the kernel's span;
- the tail: from the first SM to finish to the last.
Cycles become microseconds at the clock the programs themselves show (cycles over global-timer nanoseconds).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "tik_kernels" / "ops" / "attention.py"
#: int32 slots a program writes: clock64 at start, end of the first loop and end (lo, hi each), globaltimer at start
#: and end (lo, hi), SM, row tile, blocks of the first loop, all blocks, a written flag
SLOTS = 16
FIELDS = {"c0": 0, "c1": 2, "c2": 4, "g0": 6, "g2": 8}  # 64-bit: two slots, low word first
SMALL = {"sm": 10, "tile": 11, "n_first": 12, "n_blocks": 13, "written": 14}
HQ, HK, D = 32, 8, 128  # bench_speed.py's attention shape (Qwen3-8B)
CELLS = ((1, 1024), (16, 1024), (1, 4096), (1, 16384))

_PROBES = '''

_PROBE = None  # attn_fwd_timeline: the records' buffer, passed as the forward's unused scratch


@triton.jit
def _probe_clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _probe_timer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _probe_sm():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _probe_put64(p, i, v):
    """64-bit int `v` at int32 slots i (low word) and i + 1 (high word), as fp32 bits."""
    tl.store(p + i, (v & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True))
    tl.store(p + i + 1, (v >> 32).to(tl.int32).to(tl.float32, bitcast=True))


@triton.jit
def _probe_put32(p, i, v):
    """int `v` (below 2**31) at int32 slot i, as fp32 bits."""
    tl.store(p + i, v.to(tl.int32).to(tl.float32, bitcast=True))
'''
_RECORD = f'''    _c2 = _probe_clock()
    _g2 = _probe_timer()
    _p = t_ptr + (pid_bh * tl.num_programs(0) + tl.program_id(0)) * {SLOTS}
    _probe_put64(_p, 0, _c0)
    _probe_put64(_p, 2, _c1)
    _probe_put64(_p, 4, _c2)
    _probe_put64(_p, 6, _g0)
    _probe_put64(_p, 8, _g2)
    _probe_put32(_p, 10, _probe_sm())
    _probe_put32(_p, 11, pid_m)
    _probe_put32(_p, 12, n_in)
    _probe_put32(_p, 13, n_blocks)
    _probe_put32(_p, 14, pid_m * 0 + 1)
'''


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"attn_fwd_timeline: {where}: expected one {old.strip()!r}, found {text.count(old)} "
                         "(the forward changed: update the anchors in benchmarks/attn_fwd_timeline.py)")
    return text.replace(old, new)


def _function(text: str, name: str) -> tuple[int, int]:
    """The span of `def name` up to the next top-level decorator or def."""
    start = text.index(f"\ndef {name}(")
    ends = [m.start() for m in re.finditer(r"\n(@|def )", text) if m.start() > start]
    return start, ends[0] if ends else len(text)


def instrument(source: str) -> str:
    """The attention module's source with the forward kernel recording its timeline into its scratch (`_PROBE`)."""
    a, b = _function(source, "_attn_fwd_kernel")
    body = source[a:b]
    body = _replace_once(body, "    pid_m = _row_tile(LONGEST_FIRST)\n",
                         "    _c0 = _probe_clock()\n    _g0 = _probe_timer()\n    pid_m = _row_tile(LONGEST_FIRST)\n",
                         "the forward's start")
    body = _replace_once(body, "    for j in range(n_in, n_blocks):\n",
                         "    _c1 = _probe_clock()\n    for j in range(n_in, n_blocks):\n", "the masked loop")
    last = "    tl.store(p_l, m_t + tl.math.log2(l_row), mask=m_row)\n"
    body = _replace_once(body, last, last + _RECORD, "the forward's last store")
    a2, b2 = _function(source, "_fwd")
    host = _replace_once(source[a2:b2], '    block_n = cfg["BLOCK_N"]',
                         '    scratch = _PROBE if _PROBE is not None else scratch\n    block_n = cfg["BLOCK_N"]',
                         "the launch's scratch")
    if a2 < a:
        raise SystemExit("attn_fwd_timeline: _fwd is expected after _attn_fwd_kernel in attention.py")
    return source[:a] + body + source[b:a2] + host + source[b2:] + _PROBES


def decode(buf: np.ndarray) -> dict:
    """Per-program records from the int32 slots [programs, SLOTS] (rows never written dropped)."""
    u = buf.astype(np.int64) & 0xFFFFFFFF
    rows = u[u[:, SMALL["written"]] == 1]
    rec = {k: rows[:, i] | (rows[:, i + 1] << 32) for k, i in FIELDS.items()}
    rec.update({k: rows[:, i] for k, i in SMALL.items() if k != "written"})
    return rec


def _concurrency(starts: np.ndarray, ends: np.ndarray) -> int:
    """The most intervals open at one time."""
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends], key=lambda x: (x[0], x[1]))
    now = best = 0
    for _, d in events:
        now += d
        best = max(best, now)
    return best


def analyze(rec: dict) -> dict:
    """The figures of one launch's records (`decode`): see the module's docstring."""
    cyc_per_ns = float(np.sum(rec["c2"] - rec["c0"]) / max(np.sum(rec["g2"] - rec["g0"]), 1))
    us = 1.0 / (cyc_per_ns * 1e3)  # microseconds a cycle
    head = (rec["c1"] - rec["c0"]) * us
    tail = (rec["c2"] - rec["c1"]) * us
    out = {"programs": int(len(rec["c0"])), "sms": int(len(np.unique(rec["sm"]))), "clock_ghz": cyc_per_ns,
           "span_us": float((rec["g2"].max() - rec["g0"].min()) / 1e3),
           "program_us_median": float(np.median((rec["c2"] - rec["c0"]) * us)),
           "masked_and_end_us_median": float(np.median(tail)), "blocks_mean": float(np.mean(rec["n_blocks"]))}
    if len(np.unique(rec["n_first"])) > 1:
        slope, icpt = np.polyfit(rec["n_first"].astype(float), head, 1)
        out.update(fixed_us=float(icpt), block_us=float(slope))
    else:
        out.update(fixed_us=None, block_us=None)
    gaps, conc, busy, last = [], [], [], []
    for sm in np.unique(rec["sm"]):
        sel = rec["sm"] == sm
        order = np.argsort(rec["c0"][sel])
        c0, c2 = rec["c0"][sel][order], rec["c2"][sel][order]
        conc.append(_concurrency(c0, c2))
        if conc[-1] == 1:
            gaps.extend(((c0[1:] - c2[:-1]) * us).tolist())
        covered, reach = 0, c0[0]
        for s, e in zip(c0, c2, strict=True):
            covered += max(0, e - max(s, reach))
            reach = max(reach, e)
        busy.append(covered * us / out["span_us"])
        last.append(rec["g2"][sel].max())
    out.update(concurrency_max=int(max(conc)), concurrency_median=float(np.median(conc)),
               gap_us_median=float(np.median(gaps)) if gaps else None,
               gap_us_p90=float(np.percentile(gaps, 90)) if gaps else None,
               sm_busy_median=float(np.median(busy)), finish_spread_us=float((max(last) - min(last)) / 1e3),
               programs_per_sm_median=float(np.median(np.bincount(rec["sm"].astype(int))[np.unique(rec["sm"])])))
    return out


def _markdown(rows: list[dict], meta: dict) -> str:
    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    lines = [f"# The prefill forward's timeline, program by program ({meta['gpu']})", "",
             f"`{meta['command']}`  ", f"driver {meta['driver']}, torch {meta['torch']}, triton {meta['triton']}, "
             f"commit {meta['git_commit']}, {meta['date']}; the instrumented copy's CONFIG changes: "
             f"{meta['copy_config'] or 'none'}", "",
             "Per cell the median over the recorded launches. fixed / block: least squares of a program's time from "
             "its start to the end of its first loop over the blocks it walked; masked+end: from there to its end (the "
             "diagonal blocks, the last merge, the stores); gap: from a program's end to the next one's start on the "
             "same SM (only where one ran at a time); busy: the SM's time inside a program over the kernel's span; "
             "finish spread: the first SM done to the last. Timed: the root's forward, then the instrumented copy's "
             "(`harness.compare`: CUDA-graph replay on rotating input copies, interleaved rounds, medians).", "",
             "| cell | programs | per SM | at once | blocks | span us | timed us (root / copy) | fixed us | block us "
             "| masked+end us | gap us (p50 / p90) | busy | finish spread us | GHz |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {f(r['programs'], '.0f')} | {f(r['programs_per_sm_median'], '.0f')} | "
            f"{f(r['concurrency_max'], '.0f')} "
            f"| {f(r['blocks_mean'], '.1f')} | {f(r['span_us'], '.1f')} | {f(r['timed_us_root'], '.1f')} / "
            f"{f(r['timed_us_copy'], '.1f')} | {f(r['fixed_us'])} | {f(r['block_us'])} | "
            f"{f(r['masked_and_end_us_median'])} | {f(r['gap_us_median'])} / {f(r['gap_us_p90'])} | "
            f"{f(r['sm_busy_median'])} | {f(r['finish_spread_us'], '.1f')} | {f(r['clock_ghz'])} |")
    return "\n".join(lines) + "\n"


def _median_dicts(ds: list[dict]) -> dict:
    out = {}
    for k in ds[0]:
        vals = [d[k] for d in ds if d[k] is not None]
        out[k] = float(np.median(vals)) if vals and isinstance(vals[0], (int, float)) else (vals[0] if vals else None)
    return out


def main() -> int:
    from tik_tui.cli.common import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="")
    ap.add_argument("--cells", nargs="+", default=[f"{b}x{s}" for b, s in CELLS], help="BxS, e.g. 16x1024")
    ap.add_argument("--launches", type=positive_int, default=5,
                    help="recorded launches per cell (after two unrecorded), and the rounds of timing the root "
                         "against the copy")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a CONFIG launch value for the instrumented copy only (e.g. FWD_ONE_LOOP=1): its bits are "
                         "checked against the root's CONFIG, its time beside the root's")
    args = ap.parse_args()
    try:
        cells = [tuple(int(x) for x in c.lower().split("x")) for c in args.cells]
        assert all(len(c) == 2 and min(c) > 0 for c in cells)
    except (ValueError, AssertionError):
        ap.error("--cells: each one BxS with positive integers, e.g. 16x1024")
    over = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if not key or not value.lstrip("-").isdigit():
            ap.error(f"--set {item!r}: expected KEY=INTEGER, e.g. FWD_ONE_LOOP=1")
        over[key] = int(value)

    import torch

    from benchmarks import harness as H
    from tik_kernels.contract import load_module
    from tik_kernels.ops import attention as root

    if not torch.cuda.is_available():
        print("attn_fwd_timeline: needs a CUDA GPU (%clock64 and %globaltimer are read by the GPU)", file=sys.stderr)
        return 2
    if root.CONFIG.get("FWD_TOTAL_IN_MEMORY", 0):
        print("attn_fwd_timeline: the root keeps its total in the scratch (FWD_TOTAL_IN_MEMORY): no room for records",
              file=sys.stderr)
        return 2
    tmp = tempfile.TemporaryDirectory()  # kept until the process ends: the copy's kernels were read from it
    path = Path(tmp.name) / "attention_timeline.py"
    path.write_text(instrument(SOURCE.read_text()))
    copy = load_module(path, "attention_timeline")
    unknown = sorted(set(over) - set(copy.CONFIG))
    if unknown:
        print(f"attn_fwd_timeline: --set: no CONFIG key {', '.join(unknown)} in attention.py", file=sys.stderr)
        return 2
    copy.CONFIG.update(over)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for B, S in cells:
        q = torch.randn(B, HQ, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        cfg = copy._for_head_dim(copy._tiles(), D)  # the copy's launch (--set may change its tile)
        programs = -(-S * (HQ // HK) // cfg["BLOCK_M"]) * B * HK  # the launch grid (`_fwd`)
        buf = torch.zeros(programs * SLOTS, dtype=torch.float32, device="cuda")
        copy._PROBE = buf
        with torch.no_grad():
            want = root.attention_prefill(q, k, v)
            got = copy.attention_prefill(q, k, v)
            if not torch.equal(want.view(torch.int16), got.view(torch.int16)):
                print(f"attn_fwd_timeline: the instrumented copy's output differs from the root's at B={B} S={S}",
                      file=sys.stderr)
                return 1
            per = []
            for i in range(args.launches + 2):
                buf.zero_()
                copy.attention_prefill(q, k, v)
                torch.cuda.synchronize()
                if i >= 2:
                    per.append(analyze(decode(buf.view(torch.int32).view(programs, SLOTS).cpu().numpy())))
            # the root and the copy side by side, as every speed figure here is timed (`harness.compare`): the
            # records' cost and, with --set, the launch choice's effect
            t = H.compare({"root": root.attention_prefill, "copy": copy.attention_prefill}, (q, k, v),
                          rounds=args.launches)["contenders"]
            timed = {f"timed_us_{n}": t[n].get("median_us") for n in ("root", "copy")}
        rows.append({"cell": f"prefill[B={B},S={S}]", **_median_dicts(per), **timed})
        print(json.dumps(rows[-1]), flush=True)
        del q, k, v, buf
        copy._PROBE = None
    meta = {**H.environment(), "command": H.command_line(), "copy_config": over}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"attn_fwd_timeline{args.name}"
    (args.out / f"{stem}.json").write_text(json.dumps({**meta, "cells": rows}, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(_markdown(rows, meta))
    print(f"wrote {args.out / stem}.md / .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
