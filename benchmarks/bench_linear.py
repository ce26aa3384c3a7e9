"""linear vs cuBLAS (F.linear) on the H200, per workload cell, and the bits gate.

    PYTHONPATH=. python benchmarks/bench_linear.py --out benchmarks/results            # CONFIG as baked
    PYTHONPATH=. python benchmarks/bench_linear.py --sweep --out benchmarks/results    # offline tile sweep

Cells: the six projection shapes of Qwen3-8B / Llama-3-8B (tik_kernels.contracts.linear) × M in
DECODE_BATCHES + TRAIN_TOKENS. Timing: benchmarks/harness.py's (CUDA-graph replay of back-to-back
calls on rotating copies of x and w, several times L2 together, so weights come from HBM as in a real
forward; providers interleaved over rounds; medians in µs): GPU times, what a CUDA-graphed decode step
sees. (Results saved before the harness, e.g. linear_h200_sweep.md, timed one call after a 256 MB
L2-evicting write instead.) issue 16's linear figures come from bench_speed.py; this script owns the
CONFIG confirmation and the offline tile sweep.

Bits gate (no ratio is claimed on a red gate): for every tile configuration used (the five
buckets of CONFIG; in --sweep every candidate), rows of M = 1 and M = 4096 computed with that
configuration equal the rows of the entry point `linear` at M = 4096, bit for bit.

--sweep times every candidate tile per M bucket for each BLOCK_K and prints the CONFIG literal
that minimises the geomean ratio (BLOCK_K one value for all buckets: it is frozen); the result
is baked into tik_kernels/ops/linear.py by hand, never chosen at run time.
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
import torch.nn.functional as F  # noqa: E402

import tik_kernels  # noqa: E402,F401  (before triton)
import tik_kernels.ops.linear as L  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks.harness import bits_equal  # noqa: E402
from tik_kernels.contracts.linear import CONTRACT  # noqa: E402

BUCKETS = ("M8", "M64", "M256", "M1024", "MBIG")
#: candidate tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per bucket for the offline sweep (run 1's best kept)
SWEEP = {
    "M8": [(16, 32, 4, 6), (16, 64, 4, 6), (16, 64, 4, 8), (16, 128, 4, 4), (16, 32, 4, 8)],
    "M64": [(64, 32, 4, 4), (64, 64, 4, 4), (64, 32, 4, 6), (32, 64, 4, 4), (64, 64, 4, 3)],
    "M256": [(64, 128, 8, 4), (128, 64, 4, 4), (64, 64, 4, 4), (128, 128, 8, 3), (64, 128, 4, 4)],
    "M1024": [(128, 128, 8, 3), (128, 128, 4, 4), (128, 256, 8, 3), (128, 128, 8, 4)],
    "MBIG": [(128, 128, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (128, 256, 8, 3)],
}
#: BLOCK_K -> K_UNROLL values tried (128 for comparison: it is the same loads as 64 x 2)
SWEEP_BLOCK_K = {64: (1, 2), 128: (1,)}
#: every BLOCK_K group's bits are compared with this tile's result at M = 4096
REF_TILE = (64, 64, 4, 2, 1)
SMEM_BYTES = 220 * 1024
BITS_M = 4096


def clamp_stages(tile: tuple, bk: int) -> tuple:
    """Fewer pipeline stages when the operand tiles would not fit in shared memory."""
    bm, bn, w, s, u = tile
    per_stage = (bm + bn) * bk * u * 2
    return (bm, bn, w, max(2, min(s, SMEM_BYTES // per_stage)), u)


def candidates(bucket: str, bk: int) -> list:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL) tried in `bucket` with this BLOCK_K."""
    return list(dict.fromkeys(clamp_stages(t + (u,), bk) for u in SWEEP_BLOCK_K[bk] for t in SWEEP[bucket]))


def _compile_jobs(jobs: list) -> list:
    """Child process: run each (tile, BLOCK_K) once on a small problem so Triton's disk cache holds it."""
    import tik_kernels.ops.linear as lin

    out = []
    x = torch.randn(16, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    for tile, bk in jobs:
        try:
            lin._matmul(x, w, tile=tuple(tile), block_k=bk)
            torch.cuda.synchronize()
            out.append((tuple(tile), bk, None))
        except Exception as e:  # out of shared memory and the like: the candidate is dropped
            out.append((tuple(tile), bk, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"))
    return out


def compile_parallel(jobs: list, workers: int) -> dict:
    """(tile, bk) -> error or None. Compiles in `workers` processes (same cache keys as the real shapes)."""
    return {(t, bk): err for t, bk, err in H.in_processes(_compile_jobs, jobs, workers)}


def time_interleaved(fns: dict, reps: int, x: torch.Tensor, w: torch.Tensor) -> dict:
    """Median / p20 / p80 µs per provider fn(x, w): the harness's graph replay on rotating copies of x and w."""
    t = H.compare(fns, (x, w), rounds=reps)
    out = {}
    for k, c in t["contenders"].items():
        if "error" in c:
            raise RuntimeError(f"{k}: {c['error']}")
        out[k] = {"median": c["median_us"], "p20": H.quantile(c["samples_us"], 0.2),
                  "p80": H.quantile(c["samples_us"], 0.8), "samples": c["rounds"], "graph": c["graph"]}
    return out


def reps_for(M: int, N: int, K: int, n_fns: int, budget_s: float) -> int:
    # a replay is about 2 ms of calls (harness.plan_calls), or one call when a call is longer
    est_s = max(2e-3, 2 * N * K / 3.0e12, 2 * M * N * K / 5.0e14)
    return int(min(41, max(5, budget_s / (est_s * n_fns))))


def geomean(xs) -> float:
    """H.geomean, NaN (printable) where there is nothing to average."""
    return H.geomean(xs, empty=float("nan"))


def make_inputs(N: int, K: int, M: int, seed: int) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
    return x, w


def config_tiles() -> dict:
    keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "K_UNROLL")
    return {b: tuple(L.CONFIG[f"{b}_{k}"] for k in keys) for b in BUCKETS}


def cell_groups() -> dict:
    """(proj, N, K) -> list of cells, in the contract's order."""
    groups: dict = {}
    for c in CONTRACT.cells("gpu"):
        groups.setdefault((c.params["proj"], c.params["N"], c.params["K"]), []).append(c)
    return groups


# ----------------------------------------------------------------------------- the baked CONFIG


def run_confirm(args) -> dict:
    bk = L.CONFIG["BLOCK_K"]
    tiles = config_tiles()
    bits, rows = [], []
    for (proj, N, K), cells in cell_groups().items():
        max_m = max(c.params["M"] for c in cells)
        x, w = make_inputs(N, K, max(max_m, BITS_M), args.seed)
        ref = L.linear(x[:BITS_M], w)
        for b, tile in tiles.items():
            for m in (1, BITS_M):
                y = L._matmul(x[:m], w, tile=tile, block_k=bk)
                bits.append({"proj": proj, "N": N, "K": K, "bucket": b, "tile": list(tile), "M": m,
                             "equal": bits_equal(y, ref[:m])})
        for c in cells:
            M = c.params["M"]
            xm = x[:M]
            fns = {"tik": L.linear, "cublas": F.linear}
            t = time_interleaved(fns, reps_for(M, N, K, 2, args.cell_budget_s), xm, w)
            rows.append({"cell": c.name, "proj": proj, "models": c.params["models"], "M": M, "N": N, "K": K,
                         "coeff": c.coeff, "bucket": L._bucket(M), "tik_us": t["tik"]["median"],
                         "tik_p20_us": t["tik"]["p20"], "tik_p80_us": t["tik"]["p80"],
                         "cublas_us": t["cublas"]["median"], "cublas_p20_us": t["cublas"]["p20"],
                         "cublas_p80_us": t["cublas"]["p80"], "samples": t["tik"]["samples"],
                         "ratio": t["tik"]["median"] / t["cublas"]["median"],
                         "tik_tflops": 2 * M * N * K / t["tik"]["median"] / 1e6,
                         "tik_weight_tbps": 2 * N * K / t["tik"]["median"] / 1e6,
                         "cublas_weight_tbps": 2 * N * K / t["cublas"]["median"] / 1e6})
            print(f"{c.name:34s} tik {rows[-1]['tik_us']:9.1f} us  cublas {rows[-1]['cublas_us']:9.1f} us  "
                  f"ratio {rows[-1]['ratio']:.3f}", flush=True)
        del x, w, ref
        torch.cuda.empty_cache()
    gate = all(b["equal"] for b in bits)
    by_m = {str(m): geomean(r["ratio"] for r in rows if r["M"] == m) for m in sorted({r["M"] for r in rows})}
    summary = {"geomean_all": geomean(r["ratio"] for r in rows),
               "geomean_m_le_64": geomean(r["ratio"] for r in rows if r["M"] <= 64),
               "geomean_by_m": by_m,
               "objective_tik": sum(r["coeff"] * r["tik_us"] for r in rows),
               "objective_cublas": sum(r["coeff"] * r["cublas_us"] for r in rows)}
    summary["target_all_le_1.3"] = summary["geomean_all"] <= 1.3
    summary["target_m_le_64_le_1.5"] = summary["geomean_m_le_64"] <= 1.5
    return {"mode": "confirm", "config": dict(L.CONFIG), "bits_gate_passed": gate,
            "bits_failures": [b for b in bits if not b["equal"]], "bits_checked": len(bits),
            "summary": summary, "cells": rows}


def write_confirm_md(doc: dict, path: Path) -> None:
    s, e = doc["summary"], doc["env"]
    lines = [f"# linear vs cuBLAS on {e['gpu']}", "",
             f"`{doc['command']}`  ",
             f"torch {e['torch']}, triton {e['triton']}, driver {e['driver']}, {e['date']}", "",
             f"Bits gate: **{'passed' if doc['bits_gate_passed'] else 'FAILED'}** ({doc['bits_checked']} comparisons: "
             "each CONFIG tile at M = 1 and M = 4096 against `linear` at M = 4096, bit for bit)", ""]
    if doc["bits_gate_passed"]:
        lines += [f"Geomean time ratio (tik / cuBLAS): **{s['geomean_all']:.3f}** over {len(doc['cells'])} cells "
                  f"(target ≤ 1.3), **{s['geomean_m_le_64']:.3f}** at M ≤ 64 (target ≤ 1.5).", "",
                  "| M | " + " | ".join(s["geomean_by_m"]) + " |", "|---|" + "---|" * len(s["geomean_by_m"]),
                  "| geomean | " + " | ".join(f"{v:.3f}" for v in s["geomean_by_m"].values()) + " |", "",
                  "| cell | tik µs | cuBLAS µs | ratio | tik TFLOP/s | tik weight TB/s |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['cell']} | {r['tik_us']:.1f} | {r['cublas_us']:.1f} | {r['ratio']:.3f} | "
                  f"{r['tik_tflops']:.0f} | {r['tik_weight_tbps']:.2f} |" for r in doc["cells"]]
    else:
        lines += ["No ratios reported: the bits gate failed.", "", "```", json.dumps(doc["bits_failures"][:20]), "```"]
    lines += ["", "CONFIG:", "", "```", json.dumps(doc["config"]), "```", ""]
    path.write_text("\n".join(lines))


# ----------------------------------------------------------------------------- the offline sweep


def run_sweep(args) -> dict:
    t0 = time.time()
    jobs = [(REF_TILE, bk) for bk in SWEEP_BLOCK_K]
    jobs += [(t, bk) for bk in SWEEP_BLOCK_K for b in BUCKETS for t in candidates(b, bk)]
    jobs += [(t, L.CONFIG["BLOCK_K"]) for t in config_tiles().values()]
    errors = compile_parallel(jobs, args.workers)
    ok = {j for j, err in errors.items() if err is None}
    print(f"compiled {len(ok)}/{len(errors)} configurations in {time.time() - t0:.1f}s", flush=True)
    cand = {(b, bk): [t for t in candidates(b, bk) if (t, bk) in ok] for b in BUCKETS for bk in SWEEP_BLOCK_K}
    bits_bad: set = set()
    bits_log, timings = [], []
    cross_bk_equal = []
    for (proj, N, K), cells in cell_groups().items():
        if time.time() - t0 > args.budget_s:
            print(f"time budget reached before {proj}", flush=True)
            break
        max_m = max(c.params["M"] for c in cells)
        x, w = make_inputs(N, K, max(max_m, BITS_M), args.seed)
        refs = {bk: L._matmul(x[:BITS_M], w, tile=REF_TILE, block_k=bk) for bk in SWEEP_BLOCK_K if (REF_TILE, bk) in ok}
        if len(refs) == 2:
            cross_bk_equal.append({"proj": proj, "equal": bits_equal(*refs.values())})
        for (_b, bk), tiles in cand.items():
            for tile in tiles:
                for m in (1, BITS_M):
                    eq = bk in refs and bits_equal(L._matmul(x[:m], w, tile=tile, block_k=bk), refs[bk][:m])
                    bits_log.append({"proj": proj, "tile": list(tile), "bk": bk, "M": m, "equal": eq})
                    if not eq:
                        bits_bad.add((tile, bk))
        if L.CONFIG["BLOCK_K"] in refs:
            prod_equal = bits_equal(L.linear(x[:BITS_M], w), refs[L.CONFIG["BLOCK_K"]])
            bits_log.append({"proj": proj, "tile": "linear()", "bk": L.CONFIG["BLOCK_K"], "M": BITS_M,
                             "equal": prod_equal})
        for c in cells:
            M = c.params["M"]
            b = L._bucket(M)
            xm = x[:M]
            fns = {"cublas": F.linear, "linear()": L.linear}
            for bk in SWEEP_BLOCK_K:
                for tile in cand[(b, bk)]:
                    fns[f"{bk}:{tile}"] = lambda xm, w, tile=tile, bk=bk: L._matmul(xm, w, tile=tile, block_k=bk)
            t = time_interleaved(fns, reps_for(M, N, K, len(fns), args.cell_budget_s), xm, w)
            base = t["cublas"]["median"]
            timings.append({"cell": c.name, "M": M, "N": N, "K": K, "bucket": b, "cublas_us": base,
                            "us": {k: v["median"] for k, v in t.items()}})
            best = min((k for k in t if ":" in k), key=lambda k: t[k]["median"], default=None)
            print(f"{c.name:34s} cublas {base:9.1f} us  linear() {t['linear()']['median'] / base:.3f}  "
                  f"best {best} {t[best]['median'] / base:.3f}" if best else c.name, flush=True)
        del x, w, refs
        torch.cuda.empty_cache()
    # best tile per (bucket, BLOCK_K) by geomean ratio over the bucket's cells; then the better BLOCK_K overall
    choice = {}
    for bk in SWEEP_BLOCK_K:
        per_bucket, ratios = {}, []
        for b in BUCKETS:
            rows = [r for r in timings if r["bucket"] == b]
            scored = []
            for tile in cand[(b, bk)]:
                key = f"{bk}:{tile}"
                if (tile, bk) in bits_bad or not rows or any(key not in r["us"] for r in rows):
                    continue
                scored.append((geomean(r["us"][key] / r["cublas_us"] for r in rows), tile))
            if scored:
                g, tile = min(scored)
                per_bucket[b] = {"tile": list(tile), "geomean": g, "all": {str(t): s for s, t in scored}}
                ratios += [r["us"][f"{bk}:{tile}"] / r["cublas_us"] for r in rows]
        small = [r["us"][f"{bk}:{tuple(per_bucket[r['bucket']]['tile'])}"] / r["cublas_us"]
                 for r in timings if r["M"] <= 64 and r["bucket"] in per_bucket]
        choice[str(bk)] = {"buckets": per_bucket, "geomean_all": geomean(ratios), "geomean_m_le_64": geomean(small),
                           "complete": len(per_bucket) == len(BUCKETS)}
    complete = [bk for bk in SWEEP_BLOCK_K if choice[str(bk)]["complete"]]
    chosen = min(complete, key=lambda bk: choice[str(bk)]["geomean_all"]) if complete else None
    config = None
    if chosen is not None:
        config = {"BLOCK_K": chosen}
        for b in BUCKETS:
            bm, bn, nw, ns, u = choice[str(chosen)]["buckets"][b]["tile"]
            config.update({f"{b}_BLOCK_M": bm, f"{b}_BLOCK_N": bn, f"{b}_num_warps": nw, f"{b}_num_stages": ns,
                           f"{b}_K_UNROLL": u})
        print("CONFIG = " + json.dumps(config, indent=4), flush=True)
    current = {"geomean_all": geomean(r["us"]["linear()"] / r["cublas_us"] for r in timings),
               "geomean_m_le_64": geomean(r["us"]["linear()"] / r["cublas_us"] for r in timings if r["M"] <= 64)}
    return {"mode": "sweep", "compile_errors": {f"{bk}:{t}": e for (t, bk), e in errors.items() if e},
            "bits_gate_passed": not bits_bad and all(b["equal"] for b in bits_log),
            "bits_failures": [b for b in bits_log if not b["equal"]], "bits_checked": len(bits_log),
            "cross_block_k_equal": cross_bk_equal, "choice": choice, "chosen_block_k": chosen,
            "suggested_config": config, "current_config": dict(L.CONFIG), "current_config_ratios": current,
            "timings": timings, "elapsed_s": time.time() - t0}


def write_sweep_md(doc: dict, path: Path) -> None:
    lines = [f"# linear tile sweep on {doc['env']['gpu']}", "", f"`{doc['command']}`", "",
             f"bits gate: {'passed' if doc['bits_gate_passed'] else 'FAILED'} ({doc['bits_checked']} comparisons); "
             f"BLOCK_K 64 vs 128 equal bits: {doc['cross_block_k_equal']}", ""]
    for bk, ch in doc["choice"].items():
        lines.append(f"## BLOCK_K = {bk}: geomean {ch['geomean_all']:.3f}, M ≤ 64 {ch['geomean_m_le_64']:.3f}")
        lines += [f"- {b}: {v['tile']} geomean {v['geomean']:.3f}" for b, v in ch["buckets"].items()]
        lines.append("")
    lines += [f"current CONFIG: {doc['current_config_ratios']}", "", "suggested CONFIG:", "", "```",
              json.dumps(doc["suggested_config"], indent=4), "```", ""]
    bk = doc["chosen_block_k"]
    if bk is not None and doc["bits_gate_passed"]:
        buckets = doc["choice"][str(bk)]["buckets"]
        lines += ["Suggested CONFIG per cell (these sweep timings):", "",
                  "| cell | tile (BM, BN, warps, stages, K_UNROLL) | µs | cuBLAS µs | ratio |", "|---|---|---|---|---|"]
        for r in doc["timings"]:
            tile = tuple(buckets[r["bucket"]]["tile"])
            us = r["us"][f"{bk}:{tile}"]
            lines.append(f"| {r['cell']} | {tile} | {us:.1f} | {r['cublas_us']:.1f} | {us / r['cublas_us']:.3f} |")
        lines.append("")
    path.write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--sweep", action="store_true", help="time candidate tiles per M bucket, suggest CONFIG")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cell-budget-s", type=float, default=0.4, help="GPU seconds of timing per cell (about)")
    ap.add_argument("--budget-s", type=float, default=170.0, help="sweep: stop starting new shapes after this")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_linear needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    H.line_buffered()
    command = H.command_line()
    if args.sweep:
        doc = run_sweep(args)
        name = "linear_h200_sweep"
        doc.update(env=H.environment(), command=command)
        write_sweep_md(doc, args.out / f"{name}.md")
    else:
        doc = run_confirm(args)
        name = "linear_h200"
        doc.update(env=H.environment(), command=command)
        write_confirm_md(doc, args.out / f"{name}.md")
        s = doc["summary"]
        print(f"bits gate {'passed' if doc['bits_gate_passed'] else 'FAILED'}; geomean {s['geomean_all']:.3f}, "
              f"M<=64 {s['geomean_m_le_64']:.3f}", flush=True)
    H.write_json(args.out / f"{name}.json", doc)
    return 0 if doc["bits_gate_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
