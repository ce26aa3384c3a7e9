"""What the timing child's per-cell profile costs on this GPU, and what a cheaper profile would cost.

    PYTHONPATH=. python benchmarks/profile_cost.py [--out DIR] [--calls N]

The timing child profiles the candidate's eager call once per cell (`timing.Timer.profile`): a torch.profiler
session around spin, call and marker. On the H200 a search's linear evaluation spent 2.25 s of its 20.1 s there
(48 cells, eval_rate_h200_staged.md). This times, per profiled call (milliseconds, median of N):
- `timer_profile`: `Timer.profile` as the harness calls it;
- `session_cpu_cuda` / `session_cuda`: only entering and leaving a profiler session around the same call, with
  CPU and CUDA activities / CUDA alone (what the session's start and stop cost);
- `events_cpu_cuda` / `events_cuda`: the same plus reading its events (`prof.events()`, what the evidence reads);
- `one_session_cuda`: N calls in one CUDA-only session, events read once, divided by N.
Two calls: the library's linear root at M=64 (1-2 kernels) and a chain of 24 small elementwise kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from tik_kernels.evaluator import timing  # noqa: E402
from tik_kernels.ops.linear import linear  # noqa: E402


def _one(timer: timing.Timer, fn) -> None:
    timer.flush.zero_()
    torch.cuda.synchronize()
    torch.cuda._sleep(timer.spin_cycles)
    timer.start.record()
    fn()
    timer.end.record()
    torch.cuda._sleep(timing.MARKER_CYCLES)
    torch.cuda.synchronize()


def _ms(f, n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        xs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(xs)


def main() -> None:
    from tik_tui.cli.common import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--calls", type=positive_int, default=12)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times the torch profiler's CUDA activity)")
    n = args.calls
    timer = timing.Timer("cuda")
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1 << 16, device="cuda")

    def chain():
        y = v
        for _ in range(24):
            y = y * 1.0001 + 0.5
        return y

    calls = {"linear_m64": lambda: linear(x, w), "chain_24_kernels": chain}
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls_per_figure": n,
                 "ms_per_profiled_call": {}}
    both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    cuda = [ProfilerActivity.CUDA]
    for name, fn in calls.items():
        fn()
        torch.cuda.synchronize()
        timer.profile(fn)  # the profiler's one-time start (CUPTI) is not what a cell pays

        def session(acts, read, fn=fn):
            def go():
                with profile(activities=acts) as prof:
                    _one(timer, fn)
                if read:
                    [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            return go

        def one_session(fn=fn):
            with profile(activities=cuda) as prof:
                for _ in range(n):
                    _one(timer, fn)
            k = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            return k

        t0 = time.perf_counter()
        kernels = one_session()
        one = (time.perf_counter() - t0) * 1e3 / n
        plain = _ms(lambda fn=fn: _one(timer, fn), n)
        out["ms_per_profiled_call"][name] = {
            "unprofiled": round(plain, 3),
            "timer_profile": round(_ms(lambda fn=fn: timer.profile(fn), n), 3),
            "session_cpu_cuda": round(_ms(session(both, False), n), 3),
            "session_cuda": round(_ms(session(cuda, False), n), 3),
            "events_cpu_cuda": round(_ms(session(both, True), n), 3),
            "events_cuda": round(_ms(session(cuda, True), n), 3),
            "one_session_cuda": round(one, 3),
            "one_session_kernels_seen": kernels,
        }
        print(name, json.dumps(out["ms_per_profiled_call"][name]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_cost_h200.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
