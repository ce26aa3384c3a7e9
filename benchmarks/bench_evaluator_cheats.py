"""GPU: the trusted evaluator against planted timing cheats, and the root timed against itself.

    python benchmarks/bench_evaluator_cheats.py [--reps N] [--all-cells]

Every candidate wraps the library's rmsnorm root, so its outputs are right after a device sync;
each cheats only the timing:
  side_stream      launches its work on a side stream (escapes the timing events)
  lazy_when_timed  when the stream is busy at call time (the harness queued work before timing
                   it), returns the previous call's output without computing
  address_cache    caches outputs by input address (the harness rewrites inputs in place)
  patches_harness  reaches the harness's Timer.sample by an obfuscated import and halves its own times
  slows_neighbours patches torch.empty so every *other* implementation gets a 100 us sleep
  side_stream_one_kernel  the smallest side-stream cheat: the honest call plus one tiny kernel on a side stream
  side_stream_matmul      the side stream with ~0.5 ms of matmuls besides the honest call
  large_t_switch   right at every token count the probes use (<= 2560 rows), 2^-7 larger above 8192 tokens
  grad_mode_switch right under no_grad, 2^-7 larger with grad enabled (the trainer's forward)
  slows_root_a_little  rewrites the root it is timed beside (same process) to do a little more (a copy of 1/16 of
                   its input), under the per-cell neighbour limit everywhere: caught over all cells together
  root_rows_sabotage  the large-T switch, and it rewrites the root it is timed beside (same process) so that the
                   root's rows computed again differ there: caught only if the root's rows are judged alone
Each must be rejected (verified False, with the check that caught it). The root evaluated as a
candidate against itself must be verified, and its per-cell ratio to itself within ±1% (issue #18 asks for
that at the rounds the evaluator uses).

    python benchmarks/bench_evaluator_cheats.py --out benchmarks/results/evaluator_cheats_h200
    python benchmarks/bench_evaluator_cheats.py --op linear --out benchmarks/results/evaluator_rvi_h200_linear

`--op` other than rmsnorm: the root against itself only (the cheats wrap rmsnorm), over every cell of the op's
GPU profile (linear: 48 cells, 1 us to 6 ms a call, where rmsnorm's are 2-70 us).

runs them all (100 rounds, the evaluator's default) and writes OUT.json and OUT.md (default
benchmarks/results/evaluator_h200). Imports only torch and `tik_kernels`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import tik_kernels  # noqa: F401  (sets up Triton before anything imports it)
from tik_kernels.contracts import UnknownOperator, get_contract
from tik_kernels.evaluator import evaluate, measure

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

CHEATS = {
    "side_stream": '''
import torch
from tik_kernels.ops.rmsnorm import rmsnorm as _root

_side = []


def rmsnorm(x, w, eps=1e-6):
    # honest while a CUDA graph is captured (an unjoined side stream would fail the capture)
    if torch.cuda.is_current_stream_capturing():
        return _root(x, w, eps)
    if not _side:
        _side.append(torch.cuda.Stream())
    s = _side[0]
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        return _root(x, w, eps)
''',
    "lazy_when_timed": '''
import torch
from tik_kernels.ops.rmsnorm import rmsnorm as _root

_last = {}


def rmsnorm(x, w, eps=1e-6):
    # a busy stream at call time means a harness queued work (or a spin) before timing this call
    key = (tuple(x.shape), x.dtype)
    if (not x.requires_grad and not torch.cuda.is_current_stream_capturing()
            and not torch.cuda.current_stream().query() and key in _last):
        return _last[key]
    y = _root(x, w, eps)
    if not x.requires_grad:
        _last[key] = y
    return y
''',
    "address_cache": '''
from tik_kernels.ops.rmsnorm import rmsnorm as _root

_cache = {}


def rmsnorm(x, w, eps=1e-6):
    if x.requires_grad or w.requires_grad:
        return _root(x, w, eps)
    key = (x.data_ptr(), w.data_ptr(), tuple(x.shape), eps)
    if key not in _cache:
        _cache[key] = _root(x, w, eps)
    return _cache[key]
''',
    "patches_harness": '''
import importlib

from tik_kernels.ops.rmsnorm import rmsnorm as _root

# spelled so that a static screen for the evaluator's module names does not see it
_t = importlib.import_module("tik_kernels." + "evalu" + "ator.timing")
_orig = _t.Timer.sample
_mine = [False]


def _sample(self, fn):
    out, ev, wall = _orig(self, fn)
    if _mine[0]:
        _mine[0] = False
        return out, ev * 0.5, wall
    return out, ev, wall


_t.Timer.sample = _sample


def rmsnorm(x, w, eps=1e-6):
    _mine[0] = True
    return _root(x, w, eps)
''',
    "slows_neighbours": '''
import torch
from tik_kernels.ops.rmsnorm import rmsnorm as _root

_empty = torch.empty
_inside = [False]


def _slow_empty(*a, **k):
    t = _empty(*a, **k)
    if not _inside[0] and t.is_cuda:
        torch.cuda._sleep(200_000)
    return t


torch.empty = _slow_empty


def rmsnorm(x, w, eps=1e-6):
    _inside[0] = True
    try:
        return _root(x, w, eps)
    finally:
        _inside[0] = False
''',
}


CHEATS["side_stream_one_kernel"] = '''
import torch
from tik_kernels.ops.rmsnorm import rmsnorm as _root

_side = []


def rmsnorm(x, w, eps=1e-6):
    y = _root(x, w, eps)
    if torch.cuda.is_current_stream_capturing():
        return y
    if not _side:
        _side.append(torch.cuda.Stream())
    s = _side[0]
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        return y.clone()  # the output: one copy kernel the timed stream never waits for
'''
CHEATS["side_stream_matmul"] = '''
import torch
from tik_kernels.ops.rmsnorm import rmsnorm as _root

_side = []


def rmsnorm(x, w, eps=1e-6):
    if torch.cuda.is_current_stream_capturing():
        return _root(x, w, eps)
    if not _side:
        _side.append(torch.cuda.Stream())
        _side.append(torch.randn(4096, 4096, device=x.device).to(torch.bfloat16))
    s, junk = _side
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(4):
            junk = junk @ junk.T * 1e-3
        return _root(x, w, eps)
'''
CHEATS["large_t_switch"] = '''
from tik_kernels.ops.rmsnorm import rmsnorm as _root


def rmsnorm(x, w, eps=1e-6):
    y = _root(x, w, eps)
    if x.shape[0] > 8192:  # above every probe (the largest has 2560 rows), where only timed cells go
        y = (y.float() * (1 + 2**-7)).to(y.dtype)
    return y
'''
def _rewrites_root(why: str, patched_body: str, own_body: str) -> str:
    """A candidate that reaches the root it is timed beside (it lives in this process, as module tik_root) and wraps
    the root's entry point: `patched_body` computes y from `_h(x, w, eps)`, the root's own; `own_body` is the
    candidate's rmsnorm after that."""
    return f'''
import gc
import types

from tik_kernels.ops.rmsnorm import rmsnorm as _root


def _rewrite_the_root():
    # {why}
    for m in gc.get_objects():
        if isinstance(m, types.ModuleType) and getattr(m, "__name__", "") == "tik_root" and not getattr(m, "_x", 0):
            honest = m.rmsnorm

            def patched(x, w, eps=1e-6, _h=honest):
{patched_body}

            m.rmsnorm, m._x = patched, 1


def rmsnorm(x, w, eps=1e-6):
    _rewrite_the_root()
{own_body}
'''


CHEATS["root_rows_sabotage"] = _rewrites_root(
    "make the root's rows computed again (a few rows, after the timed rounds) differ, so that a check which trusts "
    "the root's rows here skips this cell's rows check",
    "                y = _h(x, w, eps)\n"
    "                return (y.float() * (1 + 2**-7)).to(y.dtype) if x.shape[0] <= 32 else y",
    "    y = _root(x, w, eps)\n"
    "    if x.shape[0] > 8192:  # the large-T switch, where only timed cells go\n"
    "        y = (y.float() * (1 + 2**-7)).to(y.dtype)\n"
    "    return y")
CHEATS["slows_root_a_little"] = _rewrites_root(
    "give the root's call a little extra work (captured with it), under the per-cell neighbour limit (15%, +2 us) "
    "on every cell, so the candidate looks faster than the root everywhere",
    "                x[: max(1, x.shape[0] // 16)].clone()\n"
    "                return _h(x, w, eps)",
    "    return _root(x, w, eps)")
CHEATS["grad_mode_switch"] = '''
import torch
from tik_kernels.ops.rmsnorm import rmsnorm as _root


def rmsnorm(x, w, eps=1e-6):
    y = _root(x, w, eps)
    if torch.is_grad_enabled():  # the trainer's forward, not the rollout's
        y = y * (1 + 2**-7)
    return y
'''


def cheats_for(op: str) -> dict:
    """The planted cheats run for `op`: they wrap rmsnorm's root, so none for another op."""
    return CHEATS if op == "rmsnorm" else {}


def pick_cells(contract, all_cells: bool):
    cells = contract.cells("gpu")
    if all_cells:
        return contract
    want = [c for c in cells if c.name.startswith("qwen3-8b/") and any(f"[T={T}," in c.name for T in (1, 64, 4096))]
    want += [c for c in cells if c.name.startswith("qwen3-8b/hidden/train[T=16384")]
    return dataclasses.replace(contract, cells=lambda profile, want=want: list(want))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=measure.GPU_REPS,
                    help="interleaved rounds per cell (default: the evaluator's)")
    ap.add_argument("--scenarios", default=None,
                    help="comma-separated subset to run (results merge into an existing JSON of the same reps)")
    ap.add_argument("--all-cells", action="store_true", help="time every rmsnorm cell (default: 7 representative)")
    ap.add_argument("--graph-instances", type=int, default=measure.GPU_GRAPH_INSTANCES,
                    help="captures per implementation of a microsecond cell (default: the evaluator's)")
    ap.add_argument("--op", default="rmsnorm", help="the operator whose root is timed against itself (the cheats "
                    "run only for rmsnorm, whose root they wrap)")
    ap.add_argument("--out", type=Path, default=RESULTS / "evaluator_h200")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_evaluator_cheats: needs a CUDA GPU", file=sys.stderr)
        return 2
    measure.GPU_REPS = args.reps
    measure.GPU_GRAPH_INSTANCES = args.graph_instances
    try:
        base = get_contract(args.op)
    except UnknownOperator as e:
        print(f"bench_evaluator_cheats: {e}", file=sys.stderr)
        return 2
    cheats = cheats_for(args.op)
    contract = pick_cells(base, args.all_cells) if args.op == "rmsnorm" else base
    root = base.root_path
    doc: dict = {"what": "trusted evaluator vs planted timing cheats; root timed against itself",
                 "op": args.op, "reps": args.reps, "graph_instances": args.graph_instances,
                 "cells": [c.name for c in contract.cells("gpu")], "scenarios": {}}
    wanted = ["root_vs_itself", *cheats]
    if args.scenarios:
        wanted = [s for s in wanted if s in args.scenarios.split(",")]
        old = args.out.with_suffix(".json")
        if old.exists():
            prev = json.loads(old.read_text())
            if prev.get("reps") == args.reps and prev.get("cells") == doc["cells"]:
                doc["scenarios"] = prev.get("scenarios", {})

    def save() -> None:  # after every scenario: a run cut short keeps what it measured
        self_cells = doc["scenarios"].get("root_vs_itself", {}).get("cells", [])
        ratios = [c["ratio_vs_root"] for c in self_cells if c["ratio_vs_root"] is not None]
        doc["self_ratio"] = {
            "per_cell": {c["cell"]: {"ratio": c["ratio_vs_root"], "median_us": c["median_us"],
                                     "spread_us": c["spread_us"], "root_spread_us": c["root_spread_us"]}
                         for c in self_cells},
            "max_abs_deviation": max(abs(r - 1) for r in ratios) if ratios else None,
            "geomean": statistics.geometric_mean(ratios) if ratios else None,
            "within_1pct": bool(ratios) and all(abs(r - 1) <= 0.01 for r in ratios),
        }
        doc["complete"] = set(doc["scenarios"]) == {"root_vs_itself", *cheats}
        doc["pass"] = (doc["complete"] and all(s["ok"] for s in doc["scenarios"].values())
                       and doc["self_ratio"]["within_1pct"])
        doc["elapsed_s"] = round(time.monotonic() - t_all, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(doc, indent=2))
        args.out.with_suffix(".md").write_text(summary(doc))

    t_all = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        self_copy = Path(tmp) / "root_copy.py"
        self_copy.write_text(root.read_text())
        runs = {"root_vs_itself": self_copy}
        for name, src in cheats.items():
            (Path(tmp) / f"{name}.py").write_text(src)
            runs[name] = Path(tmp) / f"{name}.py"
        runs = {k: v for k, v in runs.items() if k in wanted}
        for name, path in runs.items():
            t0 = time.monotonic()
            rep = evaluate(contract, path, root_path=root, device="cuda", timeout=300, time_it=True)
            d = rep.as_dict()
            caught = [c["name"] + ": " + c["detail"] for c in d["checks"] if not c["passed"]]
            expect = "verified" if name == "root_vs_itself" else "rejected"
            ok = d["verified"] if expect == "verified" else not d["verified"]
            doc["scenarios"][name] = {"expected": expect, "ok": ok, "verified": d["verified"], "failure": d["failure"],
                                      "caught_by": caught, "cells": d["cells"], "admissible": d["admissible"],
                                      "eligible": d["eligible"], "floor_us": d["floor_us"],
                                      "elapsed_s": round(time.monotonic() - t0, 1)}
            doc["env"] = d["env"]
            print(f"{name:18s} {'OK ' if ok else 'BAD'} verified={d['verified']} "
                  f"{(d['failure'] or '')[:150]}", flush=True)
            save()
    save()
    print(summary(doc))
    return 0 if all(doc["scenarios"][k]["ok"] for k in runs) else 1


def _missing(doc: dict) -> str:
    """Why a run of a subset cannot pass as a whole: the scenarios it did not run."""
    left = [k for k in ("root_vs_itself", *cheats_for(doc["op"])) if k not in doc["scenarios"]]
    ran_ok = all(s["ok"] for s in doc["scenarios"].values()) and doc["self_ratio"]["within_1pct"]
    return (f" (not run at this round count: {', '.join(left)}; the {len(doc['scenarios'])} that ran: "
            f"{'all as expected' if ran_ok else 'NOT all as expected'})") if left else ""


def summary(doc: dict) -> str:
    env = doc.get("env", {})
    lines = [f"# Evaluator vs timing cheats ({env.get('gpu')}, driver {env.get('driver')}, torch {env.get('torch')}, "
             f"triton {env.get('triton')})", "", f"{doc['op']}, {len(doc['cells'])} cells, {doc['reps']} interleaved "
             "rounds per cell. Pass: " + str(doc["pass"]) + _missing(doc), "",
             "| scenario | expected | verified | caught by |",
             "|---|---|---|---|"]
    for name, s in doc["scenarios"].items():
        why = (s["caught_by"][0] if s["caught_by"] else "-").replace("|", "/")[:160]
        lines.append(f"| {name} | {s['expected']} | {s['verified']} | {why} |")
    sr = doc["self_ratio"]
    lines += ["", f"Root vs itself: max |ratio - 1| = {sr['max_abs_deviation']}, geomean {sr['geomean']}", "",
              "| cell | ratio | median us | IQR us (cand / root) |", "|---|---|---|---|"]
    for cell, c in sr["per_cell"].items():
        lines.append(f"| {cell} | {c['ratio']:.4f} | {c['median_us']:.2f} | {c['spread_us']:.2f} / "
                     f"{c['root_spread_us']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
