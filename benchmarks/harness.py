"""The one way TIK's benchmark scripts time, compare and record kernels.

Method (the one issue 16's figures use). Each contender is a callable taking the same inputs. The
inputs are copied until the copies together are several times the GPU's L2 (`plan_copies`), so
that back-to-back calls read weights and KV caches from HBM, as a real forward does (a layer's
weights are never L2-resident when it runs). One CUDA graph per contender replays `calls` calls
back to back, call i on copy i mod copies (`plan_calls`): no Python launch cost, no flush kernel
between calls, no idle GPU. The contenders' replays are interleaved within every round, in a
fresh order each round, so clock and thermal drift hit all of them alike; the figure is the median
per-call time over rounds, with quantiles beside it.

A contender that cannot be captured in a graph (a host sync, an allocation the graph pool
refuses) is timed eagerly with CUDA events around the same loop of calls, and says so
(`graph: false` and the reason): such a time includes launch overhead. On a CPU (the Triton
interpreter) everything is eager and wall-clocked; those times only exercise the code path.

Also here: bit equality (`bits_equal`), geomean and quantiles, hardware-floor fractions, the
environment and command of a run (`environment`), and the read-modify-write update of a card's summary,
benchmarks/results/summary_<card>.json (summary_h200.json: the issues' figures), that changes only the keys a
benchmark owns.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
#: H200 figures the achieved rates are compared with
L2_BYTES = 50 * 1024 * 1024
COPY_TBPS = 4.2
BF16_TFLOPS = 700.0
#: the inputs' copies together are at least this many times L2
L2_FACTOR = 4
MAX_COPIES = 256


# ----------------------------------------------------------------------------- statistics


def geomean(xs: Iterable[float | None], empty: float | None = None) -> float | None:
    """Geometric mean of the values given; None entries are skipped, `empty` (None, or NaN for a printable
    table) when nothing is left.

    A zero or negative ratio is a bug upstream, not a value to average: it raises.
    """
    vals = [float(x) for x in xs if x is not None]
    if not vals:
        return empty
    if any(not v > 0 for v in vals):
        raise ValueError(f"geomean of non-positive values: {[v for v in vals if not v > 0]}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile q in [0, 1] of xs (numpy's default method)."""
    s = sorted(xs)
    if not s:
        raise ValueError("quantile of no samples")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float]) -> dict:
    return {"median_us": quantile(samples_us, 0.5), "p10_us": quantile(samples_us, 0.1),
            "p90_us": quantile(samples_us, 0.9), "min_us": min(samples_us), "rounds": len(samples_us)}


def rates(us: float, nbytes: float | None = None, flops: float | None = None) -> dict:
    """Achieved TB/s and TFLOP/s of one call of `us` µs, and their fractions of the H200's floors."""
    out = {}
    if nbytes:
        out["tbps"] = nbytes / us / 1e6
        out["copy_fraction"] = out["tbps"] / COPY_TBPS
    if flops:
        out["tflops"] = flops / us / 1e6
        out["bf16_fraction"] = out["tflops"] / BF16_TFLOPS
    return out


def measure_copy_tbps(device: str | torch.device, nbytes: int = 1 << 30, reps: int = 9) -> float | None:
    """This card's copy bandwidth, TB/s of bytes read and written by a device-to-device copy of `nbytes` (far over
    L2), the median of `reps` copies timed with CUDA events; None off CUDA. COPY_TBPS is the H200's: a floor taken
    at it is the issue's definition, this one is the floor of the card a run had (an H100 copies at ~3 TB/s)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return 2 * nbytes / quantile(times, 0.5) / 1e12


# ----------------------------------------------------------------------------- bits


_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """t's storage as integers of the same width: equal iff bit-identical (NaN payloads, -0.0 included)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t.view(torch.int8)
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    return t.view(_INT_VIEW[t.element_size()])


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, same dtype, same bits (torch.equal on integer views; NaN == NaN when the bits agree)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw_bits(a), raw_bits(b).to(a.device))


def tree_bits_equal(a, b) -> bool:
    """bits_equal over matching tuples/lists of tensors (a forward's output, a backward's gradients)."""
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(tree_bits_equal, a, b))
    return bits_equal(a, b)


# ----------------------------------------------------------------------------- profiler records


def device_kernels(prof) -> list:
    """The kernel records of a torch.profiler run (device events)."""
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def kernel_us(e) -> float:
    """A kernel record's device time in µs (`device_time`, `cuda_time` in older torch)."""
    return e.device_time if hasattr(e, "device_time") else e.cuda_time


def busy_us(kernels) -> float:
    """The union of the kernels' time ranges in µs: the device-busy time, concurrent kernels counted once."""
    union, cur = 0.0, None
    for s, e in sorted((k.time_range.start, k.time_range.end) for k in kernels):
        if cur is None or s > cur[1]:
            if cur:
                union += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    if cur:
        union += cur[1] - cur[0]
    return union


# ----------------------------------------------------------------------------- rotation bookkeeping


def tensor_bytes(args) -> int:
    """Bytes the tensors in args (nested tuples/lists/dicts) cover, each distinct tensor once: what one call
    reads from its inputs. A view counts its own elements, not its base's storage (a clone copies only those)."""
    seen, total = set(), 0
    stack = [args]
    while stack:
        a = stack.pop()
        if isinstance(a, torch.Tensor):
            key = (a.data_ptr(), tuple(a.shape), a.stride(), a.dtype, a.device)
            if key not in seen:
                seen.add(key)
                total += a.numel() * a.element_size()
        elif isinstance(a, (tuple, list)):
            stack.extend(a)
        elif isinstance(a, dict):
            stack.extend(a.values())
    return total


def plan_copies(bytes_per_copy: int, l2_bytes: int = L2_BYTES, factor: int = L2_FACTOR,
                max_copies: int = MAX_COPIES, max_total_bytes: int | None = None) -> int:
    """How many copies of the inputs make a working set of at least factor × L2.

    One copy when one copy is already that large; never more than max_copies, nor more than fit in
    max_total_bytes (the copies beyond the first are new memory).
    """
    if bytes_per_copy <= 0:
        return 1
    n = max(1, math.ceil(factor * l2_bytes / bytes_per_copy))
    n = min(n, max_copies)
    if max_total_bytes is not None:
        n = min(n, max(1, max_total_bytes // bytes_per_copy))
    return n


def plan_calls(est_call_s: float, copies: int, target_replay_s: float = 2e-3, max_calls: int = 2048) -> int:
    """Calls per graph replay: a whole number of passes over the copies (so every copy is read once per
    pass and no copy is read twice in a row), at least one pass, about target_replay_s long."""
    want = math.ceil(target_replay_s / max(est_call_s, 1e-9))
    passes = max(1, math.ceil(want / copies))
    passes = min(passes, max(1, max_calls // copies))
    return passes * copies


def rotation_order(calls: int, copies: int) -> list[int]:
    """Which copy call i reads: round-robin, so consecutive calls never share a copy (when copies > 1)."""
    return [i % copies for i in range(calls)]


def clone_args(args: tuple) -> tuple:
    """A copy of the inputs with fresh storage for every tensor (same values; a leaf that requires grad
    stays a leaf that requires grad, so a backward through the copy stops at the copy)."""
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


def make_copies(args: tuple, copies: int) -> list[tuple]:
    return [args] + [clone_args(args) for _ in range(copies - 1)]


def in_processes(fn: Callable[[list], list], items: Iterable, workers: int) -> list:
    """fn over `items` in `workers` fresh (spawned) processes, each given an interleaved share of the distinct
    items; the results concatenated. For compiling launch candidates ahead of timing: Triton's disk cache then
    holds them, so the timed process only loads them. fn must be importable (module level)."""
    import multiprocessing as mp

    items = list(dict.fromkeys(items))
    chunks = [items[i::workers] for i in range(workers) if items[i::workers]]
    if not chunks:
        return []
    with mp.get_context("spawn").Pool(len(chunks)) as pool:
        return [r for part in pool.map(fn, chunks) for r in part]


# ----------------------------------------------------------------------------- timing


def with_config(mod, over: dict, fn: Callable) -> Callable:
    """fn called with the operator module's CONFIG updated by `over`, the whole CONFIG as it was after each call (a CUDA
    graph captured through it keeps the variant's launches)."""
    def call(*args):
        saved = dict(mod.CONFIG)
        mod.CONFIG.update(over)
        try:
            return fn(*args)
        finally:
            mod.CONFIG.clear()
            mod.CONFIG.update(saved)

    return call


#: the library's operators (tik_kernels/ops' modules), whose CONFIG a benchmark's override may set (bench_e2e's
#: --decode-variant, train_profile's --variant)
OPERATORS = sorted(p.stem for p in (REPO / "tik_kernels" / "ops").glob("*.py") if not p.stem.startswith("_"))


def unknown_config_keys(variants: list[tuple[str, dict[str, dict[str, int]]]], flag: str) -> str | None:
    """The first of parsed NAME=OP.KEY=VALUE specs (`parse_config_spec`'s) that names a key the library operator's
    CONFIG lacks, as an argparse error message ('FLAG NAME: OP has no CONFIG key K'), else None."""
    import importlib

    for name, over in variants:
        for op, kv in over.items():
            unknown = sorted(set(kv) - set(importlib.import_module(f"tik_kernels.ops.{op}").CONFIG))
            if unknown:
                return f"{flag} {name}: {op} has no CONFIG key {', '.join(unknown)}"
    return None


def parse_config_spec(spec: str, ops: Iterable[str], flag: str) -> tuple[str, dict[str, dict[str, int]]]:
    """NAME=OP.KEY=VALUE[,OP.KEY=VALUE...] -> (NAME, {op: {key: value}}), OP one of `ops`: a benchmark's named run
    with other CONFIG launch values (bench_speed's --variant, bench_e2e's --decode-variant). A bad spec raises
    argparse's one-line error naming `flag`."""
    import argparse

    ops = list(ops)
    name, sep, rest = spec.partition("=")
    over: dict[str, dict[str, int]] = {}
    for item in rest.split(",") if sep else ():
        target, eq, value = item.partition("=")
        op, dot, key = target.partition(".")
        if not (eq and dot and op in ops and key and value.lstrip("-").isdigit()):
            break
        over.setdefault(op, {})[key] = int(value)
    else:
        if name and over:
            return name, over
    raise argparse.ArgumentTypeError(f"{flag} takes NAME=OP.KEY=INTEGER[,OP.KEY=INTEGER...] with OP one of "
                                     f"{', '.join(ops)}, got {spec!r}")


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop(fn: Callable, sets: list[tuple], order: list[int]) -> Callable[[], None]:
    def run():
        for i in order:
            fn(*sets[i])

    return run


def _capture(run: Callable[[], None], device: torch.device):
    """run captured in a CUDA graph (warmed on a side stream first, as torch.cuda.graph wants)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    torch.cuda.synchronize(device)
    return g


def _first_device(args: tuple) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def estimate_call_s(fn: Callable, args: tuple, device: torch.device, reps: int = 3) -> float:
    """Seconds of one call (after one warm-up call, which also compiles). On a CPU the warm-up call is the
    estimate: interpreter calls are slow and the figure only sizes the loop."""
    t = time.perf_counter()
    fn(*args)
    _sync(device)
    if device.type != "cuda":
        return time.perf_counter() - t
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn(*args)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / reps


def compare(contenders: dict[str, Callable], args: tuple, *, rounds: int = 15, nbytes: float | None = None,
            flops: float | None = None, graph: bool = True, target_replay_s: float = 2e-3,
            max_copies: int = MAX_COPIES, max_copy_bytes: int | None = None, seed: int = 0) -> dict:
    """Time every contender on rotating copies of args, interleaved over rounds; medians per call.

    contenders: name -> fn(*args). nbytes / flops: what one call must move / compute (for TB/s, TFLOP/s).
    All contenders read the same copies in the same round-robin order, so the one replayed next never starts
    on inputs the previous one left in L2.

    Returns {"contenders": {name: {median_us, p10_us, p90_us, min_us, rounds, samples_us, graph, [fallback],
    tbps, copy_fraction, tflops, bf16_fraction}}, "copies", "calls" (per replay), "working_set_bytes",
    "below_l2_factor" (True when the copies were capped short of 4 x L2: the inputs may sit in L2), "timer"}.
    A contender that raises when called is reported with its error and no times.
    """
    device = _first_device(args)
    cuda = device.type == "cuda"
    per_copy = tensor_bytes(args)
    if max_copy_bytes is None and cuda:
        free, _ = torch.cuda.mem_get_info(device)
        max_copy_bytes = free // 4
    copies = plan_copies(per_copy, max_copies=max_copies, max_total_bytes=max_copy_bytes) if cuda else 1
    sets = make_copies(args, copies)
    results: dict[str, dict] = {}
    runners: dict[str, Callable[[], None]] = {}
    est = {}
    for name, fn in contenders.items():
        try:
            est[name] = estimate_call_s(fn, args, device)
        except Exception as e:  # a contender that cannot run here is a finding, not a crash
            results[name] = {"error": one_line(e)}
    calls = plan_calls(max(est.values(), default=1e-3), copies, target_replay_s) if cuda else max(1, copies)
    order = rotation_order(calls, copies)
    for name in est:
        run = _loop(contenders[name], sets, order)
        results[name] = {"graph": False}
        if cuda and graph:
            try:
                g = _capture(run, device)
                runners[name] = g.replay
                results[name]["graph"] = True
                continue
            except Exception as e:
                torch.cuda.synchronize(device)
                results[name]["fallback"] = f"eager (graph capture failed: {one_line(e)})"
        elif cuda:
            results[name]["fallback"] = "eager (graphs off)"
        else:
            results[name]["fallback"] = "eager, CPU wall clock"
        if cuda:
            run()  # warm every copy's path the same way a capture would (a CPU call is warm after estimating)
        runners[name] = run
    _sync(device)
    samples: dict[str, list[float]] = {n: [] for n in runners}
    rng = random.Random(seed)
    names = list(runners)
    for _ in range(rounds):
        rng.shuffle(names)
        if cuda:
            evs = []
            for n in names:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                runners[n]()
                e.record()
                evs.append((n, s, e))
            torch.cuda.synchronize(device)
            for n, s, e in evs:
                samples[n].append(s.elapsed_time(e) * 1e3 / calls)
        else:
            for n in names:
                t = time.perf_counter()
                runners[n]()
                samples[n].append((time.perf_counter() - t) * 1e6 / calls)
    for n, xs in samples.items():
        results[n].update(summarize(xs), samples_us=xs)
        results[n].update(rates(results[n]["median_us"], nbytes, flops))
    del runners, sets
    return {"contenders": results, "copies": copies, "calls": calls, "working_set_bytes": per_copy * copies,
            "below_l2_factor": cuda and per_copy * copies < L2_FACTOR * L2_BYTES,
            "timer": "cuda-graph replay" if cuda and graph else ("cuda events" if cuda else "cpu wall clock")}


def best_of(timing: dict, names: Iterable[str]) -> tuple[str | None, float | None]:
    """The fastest (by median) of the named contenders that ran: (name, median µs)."""
    ran = [(timing["contenders"][n]["median_us"], n) for n in names
           if n in timing["contenders"] and "median_us" in timing["contenders"][n]]
    if not ran:
        return None, None
    us, n = min(ran)
    return n, us


# ----------------------------------------------------------------------------- provenance


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str:
    """HEAD of the repository, with '+dirty' when tracked files differ from it; 'unknown' outside git."""
    head = _run(["git", "rev-parse", "HEAD"])
    if not head:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + ("+dirty" if dirty else "")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that reproduces this run, from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = argv[0] if argv else ""
    try:
        script = str(Path(script).resolve().relative_to(REPO))
    except ValueError:
        pass
    return "PYTHONPATH=. python " + shlex.join([script, *argv[1:]])


def card_tag(device: str) -> str:
    """A results file's name for the machine: 'cpu', or the GPU's model in lower case ('h200', 'h100'), so a run
    on one card never takes another card's file name (summary_h200.json is the H200's alone)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return "cpu"
    return gpu_tag(torch.cuda.get_device_name())


def gpu_tag(gpu_name: str) -> str:
    """`card_tag` of a GPU by its name as torch gives it ('NVIDIA H100 80GB HBM3' -> 'h100'): 'gpu' if no model."""
    m = re.search(r"\b([A-Z]+\d{2,4})\b", str(gpu_name))
    return m[1].lower() if m else "gpu"


def summary_path(out: Path, card: str) -> Path:
    """A card's summary file under `out`: summary_h200.json, summary_h100.json, ... Each card's figures stay in its
    own file: a ratio measured on one card is no figure for another."""
    return Path(out) / f"summary_{card}.json"


def summary_card(path: Path) -> str | None:
    """The card a summary file's name says it holds (summary_<card>.json), else None."""
    m = re.fullmatch(r"summary_(\w+)\.json", Path(path).name)
    return m[1] if m else None


def environment(device: str | None = None) -> dict:
    """GPU, driver, library versions, git commit, date: what a result depends on besides the code's args.

    With `device`, also the evaluator's own environment record for it (`device`, `interpreter`, and `gpu` None
    on the CPU), the fields an evaluation report carries, so a benchmark of evaluations matches its reports."""
    import triton

    env = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)",
           "driver": (_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
                      or ["unknown"])[0],
           "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "git_commit": git_commit(),
           "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if device is not None:
        from tik_kernels.evaluator.report import environment as evaluation_environment

        env.update(evaluation_environment(device))
    return env


# ----------------------------------------------------------------------------- the summary file


SUMMARY_NOTE = ("Ratios are TIK time / stock time (medians, same run): lower is better, < 1 is faster than stock. "
                "Each key is written only by the benchmark named in _provenance.")


def update_summary(path: Path, values: dict, *, source: str, command: str | None = None) -> dict:
    """Read-modify-write `path`: set `values` (only those keys), record where each came from; other keys stay.

    source: the results file that holds the figures. The write is atomic (a temp file renamed over the old).
    """
    path = Path(path)
    doc = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    prov = doc.setdefault("_provenance", {})
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for k, v in values.items():
        if k.startswith("_"):
            raise ValueError(f"summary key {k!r} is reserved")
        doc[k] = v
        prov[k] = {"file": source, "command": command or command_line(), "date": stamp}
    doc["_note"] = SUMMARY_NOTE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return doc


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def line_buffered() -> None:
    """Progress lines reach a pipe as they are printed, so a run cut short still shows how far it got."""
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except AttributeError:  # a replaced stdout (pytest capture): nothing to do
        pass
