"""What a kernel engineer looks at besides latency: what the compiler made of each kernel, and how far each
workload cell is from the hardware's floor. Evidence for a proposer; it decides nothing.

`compile_evidence(op, source, device)` runs one sandboxed child (`mode: evidence`, see `run_evidence_job`).
Before the implementation is imported there (so nothing it does can change them) the child builds every
cell's `BenchCase` and keeps the bytes it must move and the flops it must do; then it imports the
implementation, calls each cell's entry point once and reads back, per compiled Triton kernel variant, what
Triton's `CompiledKernel` knows after a launch: registers per thread (`n_regs`), spilled registers
(`n_spills`), shared memory (`metadata.shared`), `num_warps`, `num_stages` and the constexprs it was
specialised on, with the cells that launched it. On the CPU interpreter nothing is compiled: the child
reports only the work per cell.

`floors(cells, work, gpu)` turns a cell's median time into achieved GB/s and TFLOP/s and the fraction of the
floor reached: the larger of bytes / copy bandwidth and flops / dense bf16 peak (H200: 4.2 TB/s, ~700
TFLOP/s sustained), so 1.0 is the roofline and 0.05 is twenty times off it.

`ncu_profile(op, source, cell, device)` runs one cell under Nsight Compute (`ncu`) when it is installed on a
GPU machine: a few metrics per kernel launch of one call. Elsewhere it says why it is not available.
"""

from __future__ import annotations

import csv
import io
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

# module level, not inside the child-side functions: the child imports this module before it closes the harness's
# modules to imports (child.guard_imports), so everything the evidence job needs must be loaded by then
from tik_kernels.evaluator.outputs import one_line
from tik_kernels.evaluator.protocol import ProtocolError
from tik_kernels.evaluator.sandbox import limits

#: GPU name substring -> (copy bandwidth in bytes/us, dense bf16 flop/us) that a cell's floor is drawn from
HARDWARE: dict[str, tuple[float, float]] = {
    "H200": (4.2e6, 7.0e8),
}
#: Nsight Compute metrics of `ncu_profile`, one row per kernel launch
NCU_METRICS = ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread",
               "launch__shared_mem_per_block", "sm__warps_active.avg.pct_of_peak_sustained_active",
               "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem")


def hardware(gpu: str | None) -> tuple[float, float] | None:
    for name, figures in HARDWARE.items():
        if gpu and name in gpu:
            return figures
    return None


def floors(cells: list[dict], work: dict[str, dict], gpu: str | None) -> list[dict]:
    """Per measured cell ({"cell", "median_us"}): bytes, flops, GB/s, TFLOP/s, and (on known hardware) the
    floor in us, the fraction of it reached and whether bytes or flops set it."""
    hw = hardware(gpu)
    out = []
    for c in cells:
        w = work.get(c.get("cell")) or {}
        med, nbytes, flops = c.get("median_us"), w.get("bytes"), w.get("flops")
        row: dict = {"cell": c.get("cell"), "median_us": med, "bytes": nbytes, "flops": flops}
        if isinstance(med, (int, float)) and med > 0:
            if nbytes:
                row["GB_s"] = round(nbytes / med / 1e3, 1)
            if flops:
                row["TFLOP_s"] = round(flops / med / 1e6, 2)
            if hw is not None and (nbytes or flops):
                t_bytes, t_flops = (nbytes or 0) / hw[0], (flops or 0) / hw[1]
                row["floor_us"] = round(max(t_bytes, t_flops), 3)
                row["floor_fraction"] = round(max(t_bytes, t_flops) / med, 4)
                row["bound"] = "memory" if t_bytes >= t_flops else "compute"
        out.append(row)
    return out


# ----------------------------------------------------------------------------- the child (untrusted side)


def _jit_functions(module: Any) -> dict[str, Any]:
    """The module's Triton kernels by name, unwrapped from autotuners / heuristics."""
    from triton.runtime.jit import JITFunction

    found = {}
    for name, v in vars(module).items():
        seen = 0
        while v is not None and not isinstance(v, JITFunction) and seen < 4:
            v, seen = getattr(v, "fn", None), seen + 1
        if isinstance(v, JITFunction):
            found[getattr(v, "__name__", name)] = v
    return found


def _caches(fn: Any) -> list[dict]:
    """The in-memory compiled-kernel dicts of a JITFunction (Triton 3.x: `device_caches[device][0]`)."""
    out = []
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(cache, dict):
            out.append(cache)
    return out


def _scalar(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str)) else None


def _variant(name: str, fn: Any, k: Any) -> dict:
    md = getattr(k, "metadata", None)
    consts = {}
    src = getattr(k, "src", None)
    for key, val in (getattr(src, "constants", None) or {}).items():
        arg = key
        if isinstance(key, tuple) and len(key) == 1 and isinstance(key[0], int):
            arg = fn.arg_names[key[0]] if key[0] < len(fn.arg_names) else str(key)
        elif isinstance(key, int):
            arg = fn.arg_names[key] if key < len(fn.arg_names) else str(key)
        if isinstance(arg, str) and _scalar(val) is not None and arg.upper() == arg:
            consts[arg] = val
    return {"kernel": name, "constexprs": consts, "num_warps": getattr(md, "num_warps", None),
            "num_stages": getattr(md, "num_stages", None), "registers": getattr(k, "n_regs", None),
            "spills": getattr(k, "n_spills", None), "shared_bytes": getattr(md, "shared", None)}


def run_evidence_job(workdir: Path, job: dict) -> dict:
    import torch

    from tik_kernels.contract import Contract, load_module

    device = job["device"]
    cmod = load_module(job["contract_file"], "tik_contract")
    contract = next(v for v in vars(cmod).values() if isinstance(v, Contract) and v.op == job["op"])
    cells = {c.name: c for c in contract.cells(job["profile"])}
    names = [n for n in job["cells"] if n in cells]
    # the work per cell, read before the implementation is imported
    work = {}
    for n in names:
        case = contract.bench_case(cells[n], job["seed"], device)
        work[n] = {"bytes": case.bytes_moved, "flops": case.flops}
        del case
    doc: dict = {"work": work, "kernels": [], "errors": {}, "import_error": None,
                 "interpreter": not device.startswith("cuda")}
    if doc["interpreter"]:
        return doc
    try:
        module = load_module(job["impl"], "tik_impl")
    except BaseException as e:  # noqa: B036
        doc["import_error"] = one_line(e)
        return doc
    fns = _jit_functions(module)
    variants: dict[tuple, dict] = {}
    for n in names:
        for fn in fns.values():
            for cache in _caches(fn):
                cache.clear()  # what is in the caches after the call is what this cell launched
        try:
            case = contract.bench_case(cells[n], job["seed"], device)
            with torch.no_grad():
                getattr(module, case.entry)(*case.args, **case.kwargs)
            torch.cuda.synchronize()
            del case
        except Exception as e:
            doc["errors"][n] = one_line(e)
            continue
        for kname, fn in fns.items():
            for cache in _caches(fn):
                for k in cache.values():
                    v = _variant(kname, fn, k)
                    key = (kname, tuple(sorted(v["constexprs"].items())), v["num_warps"], v["num_stages"])
                    variants.setdefault(key, {**v, "cells": []})["cells"].append(n)
    doc["kernels"] = list(variants.values())
    return doc


def run_ncu_cell_job(workdir: Path, job: dict) -> dict:
    """One call of one cell between cudaProfilerStart/Stop (ncu runs with --profile-from-start off)."""
    import torch

    from tik_kernels.contract import Contract, load_module

    cmod = load_module(job["contract_file"], "tik_contract")
    contract = next(v for v in vars(cmod).values() if isinstance(v, Contract) and v.op == job["op"])
    cell = next(c for c in contract.cells(job["profile"]) if c.name == job["cells"][0])
    case = contract.bench_case(cell, job["seed"], job["device"])
    module = load_module(job["impl"], "tik_impl")
    fn = getattr(module, case.entry)
    with torch.no_grad():
        fn(*case.args, **case.kwargs)  # compile outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn(*case.args, **case.kwargs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return {"kernels": [], "errors": {}}


# ----------------------------------------------------------------------------- the parent (trusted side)


def _job(contract: Any, path: Path, device: str, profile: str, cells: list[str], seed: int, mode: str,
         timeout: float) -> dict:
    import inspect


    return {"mode": mode, "op": contract.op, "contract_file": str(Path(inspect.getfile(contract.build_plan)).resolve()),
            "profile": profile, "device": device, "impl": str(path.resolve()), "cells": cells, "seed": seed,
            "limits": limits(timeout)}


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None


def _read(doc: dict, cells: list[str]) -> dict:
    """The child's reply as trusted values (types checked, sizes bounded)."""
    work = doc.get("work")
    if not isinstance(work, dict):
        raise ProtocolError("evidence: no work per cell")
    out = {"work": {n: {"bytes": _int_or_none(w.get("bytes")), "flops": _int_or_none(w.get("flops"))}
                    for n, w in work.items() if n in cells and isinstance(w, dict)},
           "errors": {str(k): str(v)[:300] for k, v in (doc.get("errors") or {}).items()}, "kernels": [],
           "import_error": str(doc["import_error"])[:300] if doc.get("import_error") else None,
           "interpreter": bool(doc.get("interpreter"))}
    for k in (doc.get("kernels") or [])[:200]:
        if not isinstance(k, dict):
            raise ProtocolError("evidence: malformed kernel entry")
        out["kernels"].append({
            "kernel": str(k.get("kernel"))[:100],
            "constexprs": {str(a)[:40]: _scalar(v) for a, v in list((k.get("constexprs") or {}).items())[:40]},
            **{f: _int_or_none(k.get(f)) for f in ("num_warps", "num_stages", "registers", "spills", "shared_bytes")},
            "cells": [str(c) for c in (k.get("cells") or []) if c in cells]})
    return out


def compile_evidence(op: Any, source: str, *, device: str, timeout: float = 300.0, seed: int = 0,
                     cells: list[str] | None = None, profile: str | None = None) -> dict:
    """Work per cell and, on the GPU, compile stats per kernel variant of `source`; {"failure": ...} when the
    child fails. The root's compiled kernels seed the child's cache (`sandbox.triton_cache`)."""
    from tik_kernels.contracts import get_contract
    from tik_kernels.evaluator.spawn import run_child

    contract = get_contract(op) if isinstance(op, str) else op
    profile = profile or ("gpu" if device.startswith("cuda") else "cpu")
    names = cells or [c.name for c in contract.cells(profile)]
    with tempfile.TemporaryDirectory(prefix="tik-evidence-") as d:
        path = Path(d) / f"{contract.op}_impl.py"
        path.write_text(source)
        job = _job(contract, path, device, profile, names, seed, "evidence", timeout)
        t0 = time.monotonic()
        outcome = run_child(job, lambda tmp: {}, lambda out, doc: _read(doc, names), timeout,
                            cache="seeded" if device.startswith("cuda") else "private")
    if outcome.failure:
        return {"failure": f"evidence child: {outcome.failure}"}
    return {**outcome.doc, "failure": None, "seconds": round(time.monotonic() - t0, 2), "profile": profile}


def ncu_profile(op: Any, source: str, cell: str, *, device: str, timeout: float = 300.0, seed: int = 0) -> dict:
    """Nsight Compute metrics of each kernel one call of `cell` launches, or {"error": why not}."""
    from tik_kernels.contracts import get_contract
    from tik_kernels.evaluator.sandbox import _kill, child_env, triton_cache

    if not device.startswith("cuda"):
        return {"error": "Nsight Compute profiles need a GPU: not available on the CPU interpreter"}
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"error": "Nsight Compute (ncu) is not installed on this machine"}
    contract = get_contract(op) if isinstance(op, str) else op
    if cell not in {c.name for c in contract.cells("gpu")}:
        return {"error": f"no cell {cell!r} in {contract.op}'s GPU workload"}
    import json
    import sys

    tmp = Path(tempfile.mkdtemp(prefix="tik-ncu-"))
    try:
        path = tmp / f"{contract.op}_impl.py"
        path.write_text(source)
        job = _job(contract, path, device, "gpu", [cell], seed, "ncu_cell", timeout)
        (tmp / "job.json").write_text(json.dumps(job))
        (tmp / "work").mkdir()
        cmd = [ncu, "--profile-from-start", "off", "--target-processes", "all", "--csv", "--page", "raw",
               "--metrics", ",".join(NCU_METRICS), sys.executable, "-m", "tik_kernels.evaluator.child", str(tmp)]
        with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(cmd, cwd=tmp / "work", env=child_env(device, tmp, triton_cache("seeded", tmp)),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return {"error": f"ncu timed out after {timeout:g} s"}
        _kill(proc)
        text = (tmp / "stdout.txt").read_text(errors="replace")
        rows = parse_ncu_csv(text)
        if rc != 0 or not rows:
            tail = [ln for ln in ((tmp / "stderr.txt").read_text(errors="replace") + text).splitlines() if ln.strip()]
            why = next((ln for ln in tail if "ERR_" in ln or "rror" in ln), tail[-1] if tail else "no output")
            return {"error": f"ncu failed (status {rc}): {why.strip()[:240]}"}
        return {"cell": cell, "kernels": rows[:50]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of `ncu --csv --page raw` (a header line, a units line, one line per launch): kernel name + metrics."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return []
    reader = list(csv.reader(io.StringIO("\n".join(lines))))
    head, rows = reader[0], reader[1:]
    if rows and rows[0] and rows[0][0] == "":  # the units line
        rows = rows[1:]
    out = []
    for r in rows:
        d = dict(zip(head, r, strict=False))
        row = {"kernel": (d.get("Kernel Name") or "?")[:100]}
        for m in NCU_METRICS:
            if m in d:
                try:
                    row[m] = float(d[m].replace(",", ""))
                except ValueError:
                    row[m] = d[m][:40]
        out.append(row)
    return out
