"""Seconds per evaluation in a running search, phase by phase: the figure issue #18's target is about.

    python benchmarks/bench_eval_rate.py [--ops linear,attention,rmsnorm] [--evals 4] [--timeout 300]
                                         [--device cuda|cpu] [--name eval_rate_h200] [--prestart N] [--plan-bytes]
                                         [--ahead on|off|both]

For each operator one process (this one) evaluates `--evals` tuner-style candidates in a row, as a search
does: each is the root's source with one CONFIG value moved to a neighbour in its TUNABLES (the tuner's own
rewrite, so every candidate compiles kernels of its own), evaluated with timing against the root. The first
evaluation pays what a search pays once (the plan, the root's probes, the control run); the figure is the
median over the evaluations after it. Every phase the report records is kept, per evaluation; the table
prints the first evaluation and the median of the rest. Results: `<out>/<name>.json` and `.md`.

`probes_candidate` is broken down in a table of its own (`PROBE_PARTS`), with the megabytes each way; `--plan-bytes`
adds what each op's plan moves, worked out on the CPU (`plan_bytes`).

`--prestart N` keeps N pre-started candidate children ready (`TIK_PRESTART`, default 2 on a GPU, 1 on the CPU; 0:
every candidate's child starts on its evaluation's critical path); the JSON records how many candidates each op's
evaluations took from a spare (`spares`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import environment, gpu_tag, summary_path, update_summary  # noqa: E402

#: the phases in table order (a report records those that ran)
PHASES = ("plan", "probes_root", "probes_candidate", "checks", "spare_settle", "device_wait", "timing_child",
          "timing_ahead", "timing_ahead_record_s", "timing_ahead_kernels", "timing_ahead_cached", "timing_cells_warmup",
          "timing_cells_warm_calls", "timing_cells_capture", "timing_cells_profile", "timing_cells_eager",
          "timing_cells_timed", "timing_cells_after", "timing_exit", "timing_read", "control_child", "judge",
          "child_close", "other")
#: probes_candidate broken down (`core.probe_phases`): the parent's start (a spare taken or a child launched), the
#: inputs it writes, the child's parts (its clock: start, inputs read, import, compute, graph replays, outputs
#: sent), the rest of the parent's wait (a fresh child's interpreter, polling), the parent reading the reply; and the
#: megabytes each way. They add up to probes_candidate (less a few ms of bookkeeping). `compiled` is a count: the
#: entries the child added to its Triton cache (kernels and launchers compiled; where the child compiles ahead,
#: `ahead_kernels` specializations its probes asked for, `ahead_cached` of which the cache held (loaded in the child),
#: the rest compiled by `ahead_workers` forked workers while the probes whose kernels were there ran, `ahead_failed`
#: of them failed or were killed, `ahead_compiled` entries added by the end of the probes; `ahead_record_s`: seconds
#: of child_ahead spent finding the specializations, the dry run; `ahead_wait_s`: seconds of child_compute the probes
#: spent waiting for the workers).
PROBE_PARTS = ("probes_candidate", "probes_candidate_start", "probes_candidate_inputs", "probes_candidate_wait_other",
               "probes_candidate_child_start", "probes_candidate_child_inputs", "probes_candidate_child_import",
               "probes_candidate_child_ahead", "probes_candidate_child_compute", "probes_candidate_child_graph",
               "probes_candidate_child_send", "probes_candidate_read", "probes_candidate_compiled",
               "probes_candidate_ahead_record_s", "probes_candidate_ahead_compiled", "probes_candidate_ahead_kernels",
               "probes_candidate_ahead_cached", "probes_candidate_ahead_workers",
               "probes_candidate_ahead_failed", "probes_candidate_ahead_wait_s", "probes_candidate_child_boot_wait",
               "probes_candidate_in_mb", "probes_candidate_out_mb")
#: the phases that follow each other (the timing_cells_* parts lie inside timing_child): "other" is the wall time
#: none of them covers (the source checks, the child's start and exit, the temporary files); checks that ran while the
#: candidate was timed (`checks_overlapped`, the GPU's order) are inside timing_child and not counted again
TOP = ("plan", "probes_root", "probes_candidate", "checks", "spare_settle", "device_wait", "timing_child",
       "control_child", "judge", "child_close")


def candidates(op: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(label, source) of the first n configs the tuner itself would try from `op`'s root (one key moved one
    step first, then two-key moves; none whose tiles exceed shared memory), each rewritten the tuner's way."""
    import itertools

    from tik_kernels.contracts import get_contract
    from tik_tui.agent.tuner import feasible_moves, rewrite_config, tunable_space

    contract = get_contract(op)
    src = contract.root_path.read_text()
    config, space = tunable_space(src, set(contract.frozen_tunables))
    if not space:
        raise SystemExit(f"bench_eval_rate: {op}'s root has no tunable CONFIG key")
    picked = list(itertools.islice(feasible_moves(src, config, space, random.Random(seed)), n))  # as the tuner does
    return [(", ".join(f"{k}={v!r}" for k, v in c.items() if v != config[k]), rewrite_config(src, c)) for c in picked]


def run_op(op: str, evals: int, device: str, timeout: float, repeat: bool = False, ahead: bool = True) -> dict:
    from tik_kernels.evaluator import ahead as ahead_mod
    from tik_kernels.evaluator import evaluate
    from tik_kernels.evaluator.spares import SPARES

    ahead_mod.ENABLED = ahead
    before = json.loads(json.dumps(SPARES.stats))  # a copy of the nested counts too

    tmp = Path(tempfile.mkdtemp(prefix=f"tik-evalrate-{op}-"))
    rows = []
    picked = candidates(op, evals)
    if repeat:
        # each candidate twice in a row. The second does NOT find its kernels compiled: a candidate's Triton cache
        # goes with its evaluation (`sandbox.candidate_cache`; a pre-started child's is a copy of the trusted cache),
        # so it compiles them again; the probes table's `compiled` column counts what each child compiled
        picked = [x for label, src in picked for x in ((label, src), (label + " (again)", src))]
    for i, (label, src) in enumerate(picked):
        path = tmp / f"{op}_cand{i}.py"
        path.write_text(src)
        t0 = time.perf_counter()
        rep = evaluate(op, path, device=device, timeout=timeout, time_it=True)
        wall = time.perf_counter() - t0
        d = rep.as_dict()
        phases = {k: round(v, 2) for k, v in d["phases"].items()}
        # checks overlapped with the timing child (`core.OVERLAP_CHECKS`) lie inside timing_child's wall time
        top = [k for k in TOP if not (k == "checks" and d["phases"].get("checks_overlapped"))]
        phases["other"] = round(wall - sum(d["phases"].get(k, 0.0) for k in top), 2)
        rows.append({"candidate": label, "wall_s": round(wall, 2), "verified": d["verified"],
                     "failure": d["failure"], "phases": phases,
                     "objective": d.get("objective"), "cells": len(d.get("cells") or []),
                     "cell_seconds": {c["cell"]: {**c.get("seconds", {}), "rounds": c.get("rounds"),
                                                  "calls": c.get("calls"), "median_us": c.get("median_us")}
                                      for c in d.get("cells") or [] if isinstance(c, dict) and "cell" in c}})
        print(f"{op} #{i} {label}: {wall:.1f} s, verified={d['verified']} "
              f"{json.dumps(rows[-1]['phases'])}", flush=True)
    fresh = [r for r in rows if not r["candidate"].endswith(" (again)")]
    later = fresh[1:] or fresh
    med = {p: round(statistics.median([r["phases"].get(p, 0.0) for r in later]), 2) for p in PHASES + PROBE_PARTS}
    spares = {k: ({p: round(x - before.get(k, {}).get(p, 0.0), 4) for p, x in v.items()} if isinstance(v, dict)
                  else v - before.get(k, 0)) for k, v in SPARES.stats.items()}
    # a candidate that fails early (a tile that does not fit in shared memory) is a cheap evaluation: the search
    # pays it too, but issue #18's figure is the judged one, so the summary takes the verified evaluations only
    judged = [r["wall_s"] for r in later if r["verified"]]
    out = {"op": op if ahead else f"{op} (no ahead)", "ahead": ahead, "evaluations": rows,
           "first_s": rows[0]["wall_s"], "spares": spares,
           "median_s_after_first": round(statistics.median(r["wall_s"] for r in later), 2),
           "median_s_verified_after_first": round(statistics.median(judged), 2) if judged else None,
           "verified_after_first": len(judged),
           "median_phases_after_first": med, "first_phases": rows[0]["phases"],
           "cells_after_first": cell_medians([r for r in later if r["verified"]])}
    again = [r for r in rows[2:] if r["candidate"].endswith(" (again)")]
    if again:  # the same candidates again (first pair left out, as above); their kernels compiled again too
        out["median_s_again"] = round(statistics.median(r["wall_s"] for r in again), 2)
        out["median_phases_again"] = {p: round(statistics.median([r["phases"].get(p, 0.0) for r in again]), 2)
                                      for p in PHASES + PROBE_PARTS}
    return out


#: the per-cell parts the markdown lists (the child's seconds per cell, `timing._time_cell`), and how many cells
CELL_COLUMNS = ("rounds", "calls", "median_us", "warm_calls", "capture", "profile", "eager", "timed", "after")
TOP_CELLS = 12


def cell_medians(rows: list[dict]) -> dict:
    """Each timed cell's seconds per part, rounds and candidate median, median over the evaluations given."""
    names = {n for r in rows for n in r.get("cell_seconds", {})}
    out = {}
    for n in sorted(names):
        per = [r["cell_seconds"][n] for r in rows if n in r.get("cell_seconds", {})]
        out[n] = {k: statistics.median(v) for k in {k for x in per for k in x}
                  if (v := [x[k] for x in per if isinstance(x.get(k), (int, float))])}
    return out


#: an entry point's output shape from its arguments, where it is not the first argument's (`plan_bytes`)
OUT_SHAPES = {"linear": lambda args: (*args[0].shape[:-1], args[1].shape[0])}


def plan_bytes(op: str, profile: str = "gpu") -> dict:
    """What a candidate's probes move for `op`'s plan of `profile`, worked out on the CPU without running anything:
    the inputs the parent sends (each distinct tensor once, as `protocol.TensorWriter` writes them) and the outputs
    an honest child sends back (each probe's output in its first argument's dtype, shaped as its grad_outputs, or
    by OUT_SHAPES, or as its first argument; the gradients of its grad_args; a graph-replayed probe's output twice
    more on the GPU; unchanged inputs are named, not sent). On the CPU interpreter the same plan of rmsnorm's GPU
    profile measured 397 MB in and 665 MB out through the child (`probes_candidate_in_mb`, `_out_mb`)."""
    import math

    import torch

    from tik_kernels.contracts import get_contract
    from tik_kernels.evaluator.core import graph_probe_ids

    plan = get_contract(op).plan(profile, 0)
    graphs = set(graph_probe_ids(plan)) if profile == "gpu" else set()
    sent: dict[int, int] = {}
    out = 0
    for p in plan.probes:
        for a in (*p.args, *p.kwargs.values(), *(p.grad_outputs or ())):
            if isinstance(a, torch.Tensor):
                sent[id(a)] = a.numel() * a.element_size()
        args = [a for a in p.args if isinstance(a, torch.Tensor)]
        first = args[0]
        if p.grad_outputs is not None and p.grad_outputs[0] is not None:
            shape = tuple(p.grad_outputs[0].shape)
        else:
            shape = tuple(OUT_SHAPES.get(p.entry, lambda a: a[0].shape)(p.args))
        y = math.prod(shape) * first.element_size()
        out += y * (3 if p.id in graphs else 1)
        out += sum(p.args[i].numel() * p.args[i].element_size() for i in p.grad_args)
    return {"op": op, "profile": profile, "probes": len(plan.probes), "in_mb": round(sum(sent.values()) / 1e6, 1),
            "out_mb": round(out / 1e6, 1)}


def _num(v: float, phase: str) -> str:
    counts = ("_compiled", "_kernels", "_cached", "_workers", "_failed")  # counts, not seconds
    return f"{v:.3g}" if phase.endswith("_mb") else f"{v:.0f}" if phase.endswith(counts) else f"{v:.1f}"


def markdown(doc: dict) -> str:
    head = "| op | first eval | median after first (verified: n) | " + " | ".join(PHASES) + " |"
    lines = [f"# Seconds per evaluation in a running search ({doc['env'].get('gpu') or 'cpu'})", "",
             f"`{doc['command']}`", "", f"Pre-started candidate children kept ready: {doc.get('prestart', 0)}.", "",
             "Phases: median over the evaluations after the first (first in brackets).",
             "", head, "|" + "---|" * (3 + len(PHASES))]
    boot = []
    for r in doc["ops"]:
        sp = r.get("spares") or {}
        if sp.get("boot_n"):
            parts = ", ".join(f"{k} {v / sp['boot_n']:.2f}" for k, v in sp["boot_s"].items())
            boot += [f"{r['op']}: a spare's start, seconds by part (mean over the {sp['boot_n']} taken ready; what "
                     f"an evaluation may still wait for: `spare_settle`, `child_boot_wait`): {parts}.", ""]
    lines[6:6] = boot
    # each evaluation's seconds and its wait for a pre-started child: a median of two hides an alternation (session
    # 36: every second evaluation waited 5-10 s for its child, the one before it none)
    each = []
    for r in doc["ops"]:
        evs = r.get("evaluations") or []
        if len(evs) > 1:
            each.append(f"{r['op']}: " + ", ".join(
                f"{e['wall_s']:.1f}{'' if e.get('verified') else ' (not verified)'}"
                f" [{e.get('phases', {}).get('probes_candidate_child_boot_wait', 0.0):.1f}]" for e in evs[1:]) + ".")
    if each:
        lines[6:6] = ["Each evaluation after the first, seconds [of them waiting for its pre-started child]: "
                      + " ".join(each), ""]
    for r in doc["ops"]:
        cells = [f"{r['median_phases_after_first'].get(p, 0):.1f} ({r['first_phases'].get(p, 0):.1f})"
                 for p in PHASES]
        v = r.get("median_s_verified_after_first")
        judged = f" ({v:.1f}: {r['verified_after_first']})" if v is not None else " (none verified)"
        lines.append(f"| {r['op']} | {r['first_s']:.1f} | **{r['median_s_after_first']:.1f}**{judged} | "
                     + " | ".join(cells) + " |")
    short = [p.removeprefix("probes_candidate_") for p in PROBE_PARTS]
    lines += ["", "probes_candidate broken down (seconds; compiled: Triton cache entries the child added; "
              "in_mb, out_mb: megabytes): median after first (first in brackets).", "",
              "| op | " + " | ".join(short) + " |", "|" + "---|" * (1 + len(short))]
    for r in doc["ops"]:
        lines.append(f"| {r['op']} | " + " | ".join(
            f"{_num(r['median_phases_after_first'].get(p, 0), p)} ({_num(r['first_phases'].get(p, 0), p)})"
            for p in PROBE_PARTS) + " |")
    if doc.get("plan_bytes"):
        lines += ["", "What each op's plan of this device's profile moves through a candidate's child (`plan_bytes`, "
                  "worked out on the CPU): megabytes.", "", "| op | probes | in | out |", "|---|---|---|---|"]
        lines += [f"| {b['op']} | {b['probes']} | {b['in_mb']:.1f} | {b['out_mb']:.1f} |" for b in doc["plan_bytes"]]
    for r in doc["ops"]:
        cells = r.get("cells_after_first") or {}
        if not cells:
            continue
        total = {n: sum(c.get(k, 0.0) for k in ("warmup", "timed", "after")) for n, c in cells.items()}
        top = sorted(cells, key=lambda n: -total[n])[:TOP_CELLS]
        lines += ["", f"{r['op']}: the {len(top)} cells the timing child spent longest on, of {len(cells)} "
                  f"({sum(total.values()):.1f} s in all; seconds, median over the verified evaluations after the "
                  "first; median_us: the candidate's time per call).", "",
                  "| cell | s | " + " | ".join(CELL_COLUMNS) + " |", "|" + "---|" * (2 + len(CELL_COLUMNS))]
        for n in top:
            lines.append(f"| {n} | {total[n]:.2f} | " + " | ".join(
                "-" if cells[n].get(k) is None else f"{cells[n][k]:.0f}" if k in ("rounds", "calls")
                else f"{cells[n][k]:.3g}" for k in CELL_COLUMNS) + " |")
    again = [r for r in doc["ops"] if "median_s_again" in r]
    if again:
        lines += ["", "The same candidates evaluated again (`--repeat`; their kernels are compiled again: a "
                  "candidate's Triton cache goes with its evaluation): median.", "",
                  "| op | median again | " + " | ".join(PHASES) + " |", "|" + "---|" * (2 + len(PHASES))]
        for r in again:
            lines.append(f"| {r['op']} | **{r['median_s_again']:.1f}** | "
                         + " | ".join(f"{r['median_phases_again'].get(p, 0):.1f}" for p in PHASES) + " |")
        lines += ["", "| op | " + " | ".join(short) + " |", "|" + "---|" * (1 + len(short))]
        for r in again:
            lines.append(f"| {r['op']} | " + " | ".join(_num(r["median_phases_again"].get(p, 0), p)
                                                        for p in PROBE_PARTS) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="linear,attention,rmsnorm")
    ap.add_argument("--evals", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--name", default=None, help="file stem (default eval_rate_h200 / eval_rate_cpu)")
    ap.add_argument("--repeat", action="store_true", help="evaluate each candidate twice in a row (the second compiles "
                    "its kernels again: a candidate's Triton cache goes with its evaluation); writes no summary key")
    ap.add_argument("--plan-bytes", action="store_true", help="also work out (on the CPU, without running anything) "
                    "the megabytes each op's plan moves through a candidate's child, into the table")
    ap.add_argument("--ahead", choices=("on", "off", "both"), default="on", help="compile a candidate's kernels "
                    "ahead of its probes on all cores (ahead.ENABLED); both: each op without, then with")
    ap.add_argument("--prestart", type=int, default=None, help="pre-started candidate children kept ready "
                    "(TIK_PRESTART; default 1, 0: none)")
    a = ap.parse_args()
    if a.prestart is not None:
        import os

        os.environ["TIK_PRESTART"] = str(a.prestart)
    import torch

    from tik_kernels.contracts import UnknownOperator, get_contract
    from tik_kernels.evaluator.spares import prestart_depth

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    for op in ops:
        try:
            get_contract(op)
        except UnknownOperator as e:
            raise SystemExit(f"bench_eval_rate: {e}") from None
    if a.evals < 1:
        raise SystemExit("bench_eval_rate: --evals must be at least 1")
    name = a.name or ("eval_rate_cpu" if device == "cpu" else "eval_rate_h200")
    doc = {"command": " ".join(["python benchmarks/bench_eval_rate.py", *sys.argv[1:]]),
           "env": environment(device), "prestart": prestart_depth(device), "ops": []}
    a.out.mkdir(parents=True, exist_ok=True)
    if a.plan_bytes:
        doc["plan_bytes"] = [plan_bytes(op, "cpu" if device == "cpu" else "gpu") for op in ops]
    runs = [(op, ahead) for op in ops for ahead in {"on": (True,), "off": (False,), "both": (False, True)}[a.ahead]]
    for op, ahead in runs:
        doc["ops"].append(run_op(op, a.evals, device, a.timeout, a.repeat, ahead))
        (a.out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (a.out / f"{name}.md").write_text(markdown(doc))
        if device.startswith("cuda") and a.evals >= 2 and not a.repeat and ahead:
            # issue #18's keys, in the card's summary: the median seconds per evaluation after the first, this
            # benchmark's only
            judged = doc["ops"][-1]["median_s_verified_after_first"]
            if judged is not None:
                update_summary(summary_path(a.out, gpu_tag(doc["env"].get("gpu"))), {f"eval_s_{op}": judged},
                               source=f"{name}.json",
                               command=doc["command"])
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
