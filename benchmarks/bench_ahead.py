"""What compiling ahead (`tik_kernels.evaluator.ahead`) saves a probes pass, and what it leaves to the real pass.

    python benchmarks/bench_ahead.py [--ops rmsnorm,linear,attention] [--workers N] [--out DIR] [--name NAME]

For each operator, in one process, the GPU plan's probes are run four ways on the root (trusted code, in-process,
no sandbox: this measures compilation, not the jail), each with a fresh import of the implementation (so no
kernel is in memory) and a Triton cache of its own:

- cold, serial:   an empty cache, every kernel compiled at its first launch, one after another (no ahead);
- cold, ahead:    an empty cache, `ahead.compile_ahead` first, then the probes;
- tuner, serial:  the tuner's first move of the root's CONFIG (what a search evaluates), the cache a copy of the
                  root's (as the evaluator seeds a candidate's), no ahead;
- tuner, ahead:   the same with `compile_ahead` first.

Per run: seconds in all, of which recording and the workers' compile span; Triton cache entries added ahead and
in the real pass, with the names of the latter (what recording missed: a kernel only reached on real data, or a
launcher). Results: `<out>/<name>.json` and `.md`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import environment  # noqa: E402


def _entries(cache: Path) -> dict[str, str]:
    """The cache's entries (directory -> what it holds: a kernel's name, or a module such as a launcher)."""
    out = {}
    if not cache.is_dir():
        return out
    for d in cache.iterdir():
        if d.name.startswith("tmp.") or not d.is_dir():
            continue
        files = sorted(f.name for f in d.iterdir())
        grp = [f for f in files if f.startswith("__grp__")]
        name = grp[0].removeprefix("__grp__").removesuffix(".json") if grp else (files[0] if files else "?")
        out[d.name] = name
    return out


def run_once(op: str, probes: list, src: str, cache: Path, ahead_on: bool, workers: int | None, tmp: Path) -> dict:
    import torch

    from tik_kernels.contract import call_probe, execute_probe, load_module
    from tik_kernels.evaluator import ahead

    os.environ["TRITON_CACHE_DIR"] = str(cache)
    cache.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{op}_{len(list(tmp.iterdir()))}.py"
    path.write_text(src)
    before = _entries(cache)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    mod = load_module(path, f"tik_ahead_{op}")
    info = {}
    if ahead_on:
        dry = [(lambda p=p: call_probe(mod, p, "cuda", values=False)) for p in probes]
        info = ahead.compile_ahead(dry, workers=workers)
    t1 = time.monotonic()
    after_ahead = _entries(cache)
    errors = [r.error for r in (execute_probe(mod, p, "cuda") for p in probes) if r.error]
    torch.cuda.synchronize()
    t2 = time.monotonic()
    end = _entries(cache)
    late = sorted(v for k, v in end.items() if k not in after_ahead)
    return {"ahead": ahead_on, "s": round(t2 - t0, 2), "ahead_s": round(t1 - t0, 2), "probes_s": round(t2 - t1, 2),
            "record_s": round(info.get("record_s", 0.0), 2), "compile_s": round(info.get("compile_s", 0.0), 2),
            "kernels_asked": info.get("kernels", 0), "cached": info.get("cached", 0), "workers": info.get("workers", 0),
            "failed": info.get("failed", 0),
            "compiled_ahead": len(set(after_ahead) - set(before)), "compiled_late": len(late), "late": late,
            "probes": len(probes), "probe_errors": errors[:3]}


def run_op(op: str, workers: int | None) -> dict:
    from benchmarks.bench_eval_rate import candidates
    from tik_kernels.contracts import get_contract

    root = get_contract(op).root_path.read_text()
    probes = get_contract(op).plan("gpu", 0).probes
    label, cand = candidates(op, 1)[0]
    tmp = Path(tempfile.mkdtemp(prefix=f"tik-ahead-{op}-"))
    try:
        rows = {}
        rows["cold, serial"] = run_once(op, probes, root, tmp / "c0", False, workers, tmp)
        rows["cold, ahead"] = run_once(op, probes, root, tmp / "c1", True, workers, tmp)
        for name, on in (("tuner, serial", False), ("tuner, ahead", True)):
            cache = tmp / f"c-{'a' if on else 's'}"
            shutil.copytree(tmp / "c0", cache)  # seeded with the root's kernels, as the evaluator seeds a candidate
            rows[name] = run_once(op, probes, cand, cache, on, workers, tmp)
        for name, r in rows.items():
            print(f"{op} {name}: {json.dumps(r)}", flush=True)
        return {"op": op, "tuner_move": label, "runs": rows}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def markdown(doc: dict) -> str:
    cols = ("s", "ahead_s", "record_s", "compile_s", "probes_s", "kernels_asked", "cached", "workers", "failed",
            "compiled_ahead", "compiled_late")
    lines = [f"# Compiling ahead: a probes pass with and without it ({doc['env'].get('gpu') or 'cpu'})", "",
             f"`{doc['command']}`", "", "Seconds (ahead_s = record_s + compile_s + forking); counts of Triton cache "
             "entries. Root probes in-process, each run a fresh import with its own cache (see the script's "
             "docstring).", "", "| op | run | " + " | ".join(cols) + " | compiled late |",
             "|" + "---|" * (3 + len(cols))]
    for o in doc["ops"]:
        for name, r in o["runs"].items():
            lines.append(f"| {o['op']} | {name} | " + " | ".join(str(r[c]) for c in cols) + " | "
                         + (", ".join(r["late"]) or "-") + " |")
    lines += ["", "Tuner moves: " + "; ".join(f"{o['op']}: {o['tuner_move']}" for o in doc["ops"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="rmsnorm,linear,attention")
    ap.add_argument("--workers", type=int, default=None, help="forked compile workers (default: the cores, at most "
                    "ahead.MAX_WORKERS)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--name", default="ahead_h200")
    a = ap.parse_args()
    import torch

    from tik_kernels.contracts import UnknownOperator, get_contract

    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    for op in ops:  # before any GPU work: a misspelt op is a one-line error, not a traceback halfway through
        try:
            get_contract(op)
        except UnknownOperator as e:
            raise SystemExit(f"bench_ahead: {e}") from None
    if not torch.cuda.is_available():
        raise SystemExit("bench_ahead: needs a CUDA GPU (the interpreter compiles nothing)")
    doc = {"command": " ".join(["python benchmarks/bench_ahead.py", *sys.argv[1:]]), "env": environment("cuda"),
           "ops": []}
    a.out.mkdir(parents=True, exist_ok=True)
    for op in ops:
        doc["ops"].append(run_op(op, a.workers))
        (a.out / f"{a.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (a.out / f"{a.name}.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
