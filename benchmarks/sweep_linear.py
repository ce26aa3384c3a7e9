"""Launch configs of the linear root per M bucket, timed against cuBLAS in the same run (H200).

    PYTHONPATH=. python benchmarks/sweep_linear.py --out benchmarks/results/linear_sweep

Cells: Qwen3-8B's projections (qkv, o, gate_up, down) × M in 1 … 16384, and lm_head at M = 1,
16, 256 (`--model` for another model's, `--buckets` for some M buckets only; `--kchunk`, `--tma` and `--set KEY=VALUE`
set CONFIG for the whole run, e.g. `--kchunk 4096 --set ONE_CHUNK=0`). Per bucket of
tik_kernels.ops.linear, ~10-30 candidate launches (tile, warps, stages,
K_UNROLL, SPLIT, fused or separate combine); none may change bits, so each candidate's output
is compared with the entry point's, bit for bit, and a candidate that differs is reported and
never chosen. The entry point's rows at every M are also compared with the same rows of the
largest M of that shape (batch invariance at real shapes).

Timing: each provider (cuBLAS `x @ w.T`, the entry point `linear`, each candidate) is captured
in a CUDA graph of back-to-back calls on rotating copies of x and w (more bytes than L2 holds,
so the weights come from HBM as in a real layer); graphs replayed in interleaved rounds, in a
random order every round; medians of the per-call time (`benchmarks/harness.compare`). Candidates are compiled first in
parallel processes (Triton's disk cache), so the timed process only loads them.

Writes <out>/sweep.json and <out>/sweep.md: per cell cuBLAS µs and each candidate's ratio, per
bucket the candidate with the lowest geomean ratio, and the CONFIG literal those make (to be
baked into tik_kernels/ops/linear.py by hand; nothing is chosen at run time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401  (before triton)
import tik_kernels.ops.linear as L  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks.sweep_cells import best_launch  # noqa: E402
from tik_kernels.contracts.linear import projections  # noqa: E402
from tik_kernels.models import MODELS, QWEN3_8B  # noqa: E402

#: what a geomean over nothing prints as (the local mean did the same)
NAN = float("nan")

MS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
LM_HEAD_MS = (1, 16, 256)
BUCKETS = tuple(name for _, name in L.M_BUCKETS) + ("MBIG",)
#: the environment variable that hands the run's CONFIG (--tma, --kchunk, --set) to the compile processes, as JSON
SET_ENV = "SWEEP_LINEAR_CONFIG"
KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "K_UNROLL", "SPLIT")
#: candidate launches per bucket: (BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL, SPLIT); each also
#: with the combine CONFIG does not use for the bucket's own tile (fused vs a second kernel)
CANDIDATES = {
    "M16": [(16, bn, 4, 6, 2, s) for bn in (32, 64) for s in (0, 2, 4, 8)]
    + [
        (16, 128, 4, 4, 2, 0),
        (16, 128, 4, 4, 2, 4),
        (16, 64, 4, 8, 1, 4),
        (16, 32, 2, 8, 2, 4),
        (16, 64, 8, 4, 4, 4),
        (16, 16, 2, 8, 4, 4),
        # K_UNROLL 1 forms (what a swapped launch takes whatever its K_UNROLL: with two dots an iteration Triton 3.6
        # waits for each swapped wgmma, results/linear_offline_s45.txt), and wide 16-token tiles of 128 or 256 weight
        # rows, which only SWAP (the weight's rows as wgmma's rows) puts on wgmma
        (16, 64, 4, 6, 1, 4),
        (16, 64, 4, 6, 1, 0),
        (16, 128, 4, 6, 1, 4),
        (16, 128, 4, 4, 1, 8),
        (16, 256, 8, 4, 1, 4),
        (16, 256, 8, 4, 1, 8),
    ],
    "M64": [(64, 64, 4, 4, 2, s) for s in (0, 1, 2, 4)]
    + [(64, 32, 4, 6, 2, s) for s in (0, 2, 4)]
    + [
        (64, 128, 4, 4, 2, 0),
        (64, 128, 4, 4, 2, 2),
        (64, 128, 8, 4, 1, 1),
        (32, 64, 4, 6, 2, 2),
        (64, 64, 4, 6, 1, 2),
        (64, 256, 8, 3, 1, 1),
        (64, 32, 4, 4, 1, 2),
        (64, 32, 4, 6, 1, 4),
        (32, 64, 4, 4, 1, 2),
        (32, 64, 4, 6, 1, 4),
        (16, 64, 4, 4, 2, 4),
        (16, 128, 4, 4, 2, 2),
        (64, 128, 8, 4, 1, 2),
        (64, 64, 4, 4, 1, 4),
        # deeper pipelines (H200 2026-12-04: 6 stages beat 4 at most M64 / M256 cells)
        (64, 32, 4, 8, 1, 4),
        (64, 32, 4, 6, 1, 8),
        (64, 64, 4, 8, 1, 2),
        (64, 64, 4, 6, 1, 4),
        (64, 64, 4, 6, 1, 1),
        (32, 64, 4, 8, 1, 4),
        (64, 128, 8, 6, 1, 1),
        (64, 128, 8, 5, 1, 2),
        # narrow tiles: a small model's outputs (qwen3-0.6b: N = 1024) give 16 programs of 64 x 64
        (16, 32, 4, 6, 1, 2),
        (16, 64, 4, 6, 1, 2),
        (32, 32, 4, 6, 1, 2),
        (32, 64, 4, 6, 1, 2),
        (16, 32, 2, 8, 1, 2),
        (16, 16, 2, 8, 1, 4),
        (64, 16, 4, 6, 1, 2),
    ],
    "M256": [(64, 128, 4, 4, 2, s) for s in (0, 1, 2)]
    + [(128, 128, 8, 3, 1, s) for s in (0, 1, 2)]
    + [
        (128, 64, 4, 4, 2, 0),
        (128, 64, 4, 4, 2, 1),
        (64, 64, 4, 4, 2, 1),
        (128, 256, 8, 3, 1, 1),
        (64, 256, 8, 3, 1, 1),
        (128, 128, 8, 4, 1, 1),
        (128, 128, 4, 4, 1, 1),
        (64, 64, 4, 4, 1, 0),
        (64, 64, 4, 6, 1, 0),
        (128, 64, 4, 4, 1, 0),
        (128, 64, 8, 4, 1, 0),
        (64, 128, 4, 3, 1, 0),
        (64, 128, 8, 4, 1, 0),
        (64, 256, 8, 3, 1, 0),
        (128, 128, 8, 4, 1, 0),
        (64, 64, 4, 4, 1, 2),
        # deeper pipelines, and splits without K_UNROLL (H200 2026-12-04: o M=256 1.22x -> 1.00x from 4 to 6 stages)
        (64, 64, 4, 8, 1, 0),
        (64, 64, 4, 6, 1, 1),
        (64, 64, 4, 6, 1, 2),
        (64, 128, 4, 6, 1, 0),
        (64, 128, 4, 5, 1, 2),
        (64, 128, 8, 6, 1, 0),
        (64, 128, 8, 6, 1, 2),
        (128, 64, 4, 6, 1, 0),
        (128, 64, 4, 8, 1, 0),
        (128, 128, 8, 5, 1, 0),
    ],
    "M1024": [(128, 128, 8, 3, 1, s) for s in (0, 1)]
    + [(128, 256, 8, 3, 1, s) for s in (0, 1)]
    + [
        (128, 128, 8, 4, 1, 0),
        (128, 128, 4, 4, 1, 0),
        (128, 128, 8, 3, 2, 0),
        (256, 128, 8, 3, 1, 0),
        (64, 128, 4, 4, 1, 1),
        (128, 64, 4, 4, 1, 1),
        (128, 256, 8, 4, 1, 0),
        (128, 128, 8, 5, 1, 0),
    ],
    "MBIG": [
        (128, 128, 8, 3, 1, 0),
        (128, 128, 8, 4, 1, 0),
        (128, 256, 8, 3, 1, 0),
        (256, 128, 8, 3, 1, 0),
        (128, 128, 4, 4, 1, 0),
        (128, 128, 8, 3, 2, 0),
        (128, 256, 8, 4, 1, 0),
        (256, 128, 8, 4, 1, 0),
        (128, 128, 8, 5, 1, 0),
    ],
}
SMEM_BYTES = 220 * 1024
#: where the timed run happens (a dry run of the bookkeeping in the tests sets "cpu")
DEVICE = "cuda"
#: bytes of rotating input copies per provider (H200 L2 is 60 MB: the weights never stay resident)


def bucket_tile(b: str) -> tuple:
    return tuple(L.CONFIG[f"{b}_{k}"] for k in KEYS)


def clamp(tile: tuple) -> tuple:
    """Fewer pipeline stages when the operand tiles would not fit in shared memory."""
    bm, bn, w, s, u, sp = tile
    per_stage = (bm + bn) * L.CONFIG["BLOCK_K"] * u * 2
    return (bm, bn, w, max(2, min(s, SMEM_BYTES // per_stage)), u, sp)


def bucket_limit(b: str) -> int:
    """The most rows a bucket serves (MBIG: no limit)."""
    return dict((name, limit) for limit, name in L.M_BUCKETS).get(b, 1 << 62)


def config_fused(b: str) -> bool:
    """Whether CONFIG's launch for the bucket's rows combines a split in its last program (FUSED_COMBINE, up to
    FUSED_MAX_M rows) or in a second kernel: what the entry point does at the bucket's largest M."""
    return bool(L.CONFIG["FUSED_COMBINE"]) and bucket_limit(b) <= L.CONFIG["FUSED_MAX_M"]


def suggested_combine(best_fused: dict[str, bool]) -> dict[str, int]:
    """FUSED_COMBINE and FUSED_MAX_M from each split bucket's best combine: fused up to the largest bucket whose best
    launch fused (the smallest FUSED_MAX_M value that covers it), a second kernel above; none fused: FUSED_COMBINE 0."""
    fused = [bucket_limit(b) for b, f in best_fused.items() if f]
    if not fused:
        return {"FUSED_COMBINE": 0}
    top = max(fused)
    return {"FUSED_COMBINE": 1, "FUSED_MAX_M": min(v for v in L.TUNABLES["FUSED_MAX_M"] if v >= top)}


def candidates(b: str) -> list:
    """(tile, fused) per bucket: the CONFIG tile with CONFIG's combine for the bucket first (the default every bit
    comparison uses), the other combine after the rest."""
    fused = config_fused(b)
    tiles = list(dict.fromkeys([bucket_tile(b)] + [clamp(t) for t in CANDIDATES[b]]))
    out = [(t, fused) for t in tiles]
    if bucket_tile(b)[-1]:
        out.append((bucket_tile(b), not fused))
    return out


def config_value(text: str) -> tuple[str, int]:
    """`--set KEY=VALUE`: a CONFIG key of the linear root and one of its TUNABLES values."""
    key, _, value = text.partition("=")
    if key not in L.TUNABLES or not value.lstrip("-").isdigit() or int(value) not in L.TUNABLES[key]:
        raise argparse.ArgumentTypeError(f"{text!r}: not KEY=VALUE, KEY a key of linear's TUNABLES, VALUE one of its")
    return key, int(value)


def label(tile: tuple, fused: bool) -> str:
    return ",".join(map(str, tile)) + ("" if not tile[-1] else ",fused" if fused else ",kernel")


def _compile_jobs(jobs: list) -> list:
    """Child process: launch each candidate on a small problem (2 chunks) so Triton's disk cache holds it.

    The weight is wider than NARROW_N, so its K is cut in KCHUNK's chunks as the Qwen3-8B cells' are: at 256 rows
    (session 44) it took NARROW_KCHUNK's, four chunks where two were meant, so the "walking" launch split and fused
    its combine, and the 128 x 256 tiles asked 327,712 B of shared memory for that, failed, and were left out of
    the timing although the walking launch the cells run needs 196,640."""
    import tik_kernels.ops.linear as lin

    # the parent's --tma / --kchunk / --set (spawned processes do not share its CONFIG)
    lin.CONFIG.update(json.loads(os.environ.get(SET_ENV, "{}")))
    out = []
    x = torch.randn(16, 2 * lin.CONFIG["KCHUNK"], device="cuda").to(torch.bfloat16)
    w = torch.randn(lin.CONFIG["NARROW_N"] + 256, 2 * lin.CONFIG["KCHUNK"], device="cuda").to(torch.bfloat16)
    for tile, fused in jobs:
        try:
            lin._matmul(x, w, tile=tuple(tile), chunks_per_prog=2)
            if tile[-1]:
                lin._matmul(x, w, tile=tuple(tile), chunks_per_prog=1, fused=fused)
            torch.cuda.synchronize()
            out.append((tuple(tile), fused, None))
        except Exception as e:  # out of shared memory and the like: the candidate is dropped
            out.append((tuple(tile), fused, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"))
    return out


def compile_parallel(jobs: list, workers: int) -> dict:
    return {(t, f): err for t, f, err in H.in_processes(_compile_jobs, jobs, workers)}


def shapes(buckets=BUCKETS, model=QWEN3_8B) -> list:
    """(name, N, K, Ms) of every cell of `model`; with `buckets`, only the Ms whose M bucket is one of them."""
    out = [(p.name, p.N, p.K, MS) for p in projections((model,))]
    out += [("lm_head", model.vocab, model.hidden, LM_HEAD_MS)]
    out = [(n, N, K, tuple(m for m in ms if L._bucket(m) in buckets)) for n, N, K, ms in out]
    return [s for s in out if s[3]]


def run(args) -> dict:
    t0 = time.time()
    buckets = tuple(args.buckets or BUCKETS)
    # a cell is timed with the candidates of the bucket whose launch serves it: WIDE_WAVES sends wide M256 /
    # M1024 outputs (lm_head, gate_up) to MBIG's, so those cells choose among MBIG's launches
    sms = L.sm_count(torch.device(DEVICE))
    model = next(m for m in MODELS if m.name == args.model)
    served = sorted({L._launch_bucket(M, N, sms) for _, N, _, ms in shapes(buckets, model) for M in ms})
    cand = {b: candidates(b) for b in served}
    errors = compile_parallel([c for cs in cand.values() for c in cs], args.workers)
    cand = {b: [c for c in cs if errors.get(c) is None] for b, cs in cand.items()}
    print(
        f"compiled {sum(e is None for e in errors.values())}/{len(errors)} candidates in {time.time() - t0:.0f}s",
        flush=True,
    )
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    cells, bits_bad, rows_checked = [], [], []
    for proj, N, K, ms in shapes(buckets, model):
        if time.time() - t0 > args.budget_s:
            print(f"time budget reached before {proj}", flush=True)
            break
        m_max = max(ms)
        w0 = (torch.randn(N, K, generator=gen, device=DEVICE) / math.sqrt(K)).to(torch.bfloat16)
        x0 = torch.randn(m_max, K, generator=gen, device=DEVICE).to(torch.bfloat16)
        big = L.linear(x0, w0)
        for M in ms:
            b = L._launch_bucket(M, N, sms)
            x = x0[:M].clone()
            ref = L.linear(x, w0)
            rows_checked.append({"proj": proj, "M": M, "equal": H.bits_equal(ref, big[:M])})
            fns = {"cublas": lambda x, w: x @ w.t(), "linear": L.linear}
            for tile, fused in cand[b]:
                y = L._matmul(x, w0, tile=tile, fused=fused)
                if not H.bits_equal(y, ref):
                    bits_bad.append({"proj": proj, "M": M, "candidate": label(tile, fused)})
                    continue
                fns[label(tile, fused)] = lambda x, w, tile=tile, fused=fused: L._matmul(x, w, tile=tile, fused=fused)
            # the harness's method: every contender a CUDA graph of back-to-back calls on rotating copies of x and
            # w (weights from HBM, as in a forward), interleaved over rounds
            timed = H.compare(fns, (x, w0), rounds=args.rounds)["contenders"]
            bad = {k: c["error"] for k, c in timed.items() if "error" in c}
            if bad:
                raise RuntimeError(f"{proj} M={M}: " + "; ".join(f"{k}: {v}" for k, v in bad.items()))
            us = {k: c["median_us"] for k, c in timed.items()}
            base = us["cublas"]
            cells.append(
                {
                    "proj": proj,
                    "M": M,
                    "N": N,
                    "K": K,
                    "bucket": b,
                    "cublas_us": base,
                    "linear_us": us["linear"],
                    "us": {k: v for k, v in us.items() if k not in ("cublas",)},
                }
            )
            best = min((k for k in us if k not in ("cublas", "linear")), key=us.get, default="linear")
            print(
                f"{proj:8s} M={M:<6d} cublas {base:9.1f} us  linear {us['linear'] / base:.3f}  "
                f"best {best} {us[best] / base:.3f}",
                flush=True,
            )
            del x, ref, fns, timed
        del w0, x0, big
        torch.cuda.empty_cache()

    choice, config, best_fused = {}, dict(L.CONFIG), {}
    for b in served:
        rows = [c for c in cells if c["bucket"] == b]
        scored = []
        for tile, fused in cand[b]:
            key = label(tile, fused)
            if rows and all(key in r["us"] for r in rows):
                scored.append((H.geomean((r["us"][key] / r["cublas_us"] for r in rows), empty=NAN), key, tile, fused))
        if not scored:
            continue
        g, key, tile, fused = min(scored)
        choice[b] = {
            "best": key,
            "geomean": g,
            "default": label(*cand[b][0]),
            "default_geomean": next((s for s, k, *_ in scored if k == label(*cand[b][0])), None),
            "all": {k: s for s, k, *_ in sorted(scored)},
        }
        config.update({f"{b}_{k}": v for k, v in zip(KEYS, tile, strict=True)})
        if tile[-1]:
            best_fused[b] = fused
    # the combine is chosen by rows (FUSED_COMBINE, FUSED_MAX_M), not per bucket
    if best_fused:
        config.update(suggested_combine(best_fused))
    best_ratio = [c["us"][choice[c["bucket"]]["best"]] / c["cublas_us"] for c in cells if c["bucket"] in choice]

    def summary(ratios: list, small: list) -> dict:
        return {
            "geomean": H.geomean(ratios, empty=NAN),
            "worst": max(ratios, default=float("nan")),
            "m_le_16_geomean": H.geomean(small, empty=NAN),
        }

    linear_ratio = [c["linear_us"] / c["cublas_us"] for c in cells]
    return {
        "config": dict(L.CONFIG),
        "suggested_config": config,
        "choice": choice,
        "summary_linear": summary(linear_ratio, [c["linear_us"] / c["cublas_us"] for c in cells if c["M"] <= 16]),
        "summary_best": summary(
            best_ratio,
            [
                c["us"][choice[c["bucket"]]["best"]] / c["cublas_us"]
                for c in cells
                if c["M"] <= 16 and c["bucket"] in choice
            ],
        ),
        "bits_gate_passed": not bits_bad and all(r["equal"] for r in rows_checked),
        "bits_failures": bits_bad,
        "rows_vs_largest_m": rows_checked,
        "compile_errors": {label(t, f): e for (t, f), e in errors.items() if e},
        "cells": cells,
        "elapsed_s": time.time() - t0,
    }


def write_md(doc: dict, path: Path) -> None:
    e = doc["env"]
    lines = [
        f"# linear tree root: launch configs per M bucket vs cuBLAS on {e['gpu']}",
        "",
        f"`{doc['command']}`  ",
        f"torch {e['torch']}, triton {e['triton']}, {e['date']}",
        "",
        f"Bits gate: **{'passed' if doc['bits_gate_passed'] else 'FAILED'}** (every candidate's output equals "
        "the entry point's; the entry point's rows at every M equal the rows of the shape's largest M)",
        "",
    ]
    if not doc["bits_gate_passed"]:
        lines += [
            "```",
            json.dumps(doc["bits_failures"][:20]),
            json.dumps([r for r in doc["rows_vs_largest_m"] if not r["equal"]][:20]),
            "```",
            "",
        ]
    for name in ("summary_linear", "summary_best"):
        s = doc[name]
        lines.append(
            f"- {name.removeprefix('summary_')}: geomean {s['geomean']:.3f}× cuBLAS, worst {s['worst']:.3f}×, "
            f"M ≤ 16 geomean {s['m_le_16_geomean']:.3f}×"
        )
    lines += ["", "| bucket | CONFIG's launch | its geomean | best launch | best geomean |", "|---|---|---|---|---|"]
    for b, c in doc["choice"].items():
        dg = f"{c['default_geomean']:.3f}" if c["default_geomean"] else "-"
        lines.append(f"| {b} | {c['default']} | {dg} | {c['best']} | {c['geomean']:.3f} |")
    lines += [
        "",
        "Launch = BLOCK_M,BLOCK_N,num_warps,num_stages,K_UNROLL,SPLIT[,combine].",
        "",
        # the cell's own fastest launch beside the bucket's: a launch that wins a few cells by far and loses the others
        # never is a bucket's best (benchmarks/sweep_cells.py reads the same cell by cell across sweeps)
        "| cell | cuBLAS µs | linear µs | ratio | best ratio (bucket's best launch) | the cell's best launch "
        "| its ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        best = doc["choice"].get(c["bucket"], {}).get("best")
        br = f"{c['us'][best] / c['cublas_us']:.3f}" if best in c["us"] else "-"
        own = best_launch(c)
        cb = f"{own[0]} | {own[1]:.3f}" if own else "- | -"
        lines.append(
            f"| {c['proj']} M={c['M']} (N={c['N']}, K={c['K']}) | {c['cublas_us']:.1f} | "
            f"{c['linear_us']:.1f} | {c['linear_us'] / c['cublas_us']:.3f} | {br} | {cb} |"
        )
    lines += [
        "",
        "Suggested CONFIG (best launch per bucket):",
        "",
        "```",
        "CONFIG = " + json.dumps(doc["suggested_config"], indent=4),
        "```",
        "",
    ]
    if doc["compile_errors"]:
        lines += ["Candidates that failed to compile:", "", "```", json.dumps(doc["compile_errors"], indent=1), "```"]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for sweep.json and sweep.md")
    ap.add_argument(
        "--kchunk",
        type=int,
        choices=L.TUNABLES["KCHUNK"],
        default=None,
        help="CONFIG['KCHUNK'] for this run: a different reduction tree (other bits), to choose the frozen value",
    )
    ap.add_argument(
        "--tma",
        type=int,
        choices=(0, 1),
        default=None,
        help="CONFIG['TMA'] for this run (operands through TMA descriptors; changes no bits)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=config_value,
                    help="a CONFIG launch key for this run (repeatable; e.g. ONE_CHUNK=1), in every candidate")
    ap.add_argument("--model", default=QWEN3_8B.name, choices=[m.name for m in MODELS],
                    help="whose projections and lm_head are the cells (default qwen3-8b)")
    ap.add_argument("--buckets", nargs="+", choices=BUCKETS, default=None,
                    help="only the cells whose M falls in these buckets (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--workers", type=int, default=12, help="compile processes")
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no new shape after this many seconds")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sweep_linear: needs a CUDA GPU")
    run_config = dict(args.set)
    for key, value in (("TMA", args.tma), ("KCHUNK", args.kchunk)):
        if value is not None:
            run_config[key] = value
    L.CONFIG.update(run_config)
    os.environ[SET_ENV] = json.dumps(run_config)
    doc = run(args)
    doc["tma"], doc["kchunk"], doc["run_config"] = L.CONFIG["TMA"], L.CONFIG["KCHUNK"], run_config
    doc["env"] = H.environment() | {"sms": torch.cuda.get_device_properties(0).multi_processor_count}
    doc["command"] = "python benchmarks/sweep_linear.py " + " ".join(sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(doc, indent=1))
    write_md(doc, out / "sweep.md")
    print(
        f"wrote {out / 'sweep.json'} and {out / 'sweep.md'} in {doc['elapsed_s']:.0f}s; "
        f"linear {doc['summary_linear']['geomean']:.3f}x, best per bucket {doc['summary_best']['geomean']:.3f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()
