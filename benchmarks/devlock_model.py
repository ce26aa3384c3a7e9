"""A CPU model of evaluator processes sharing one GPU through the device lock (tik_kernels/evaluator/devlock.py).

    python benchmarks/devlock_model.py [--evals 8] [--probes-s 0.3] [--timing-s 0.3] [--spare-s 2.0 0.35 0] [--depth 2]

No GPU and no kernels: each process runs `--evals` / N evaluations shaped as `core.evaluate` holds the lock (shared
for the whole evaluation: probes, then the candidate's timing exclusive, a third of the probes' time of checks, the
control's timing exclusive for half as long), and keeps `--depth` pre-started children starting, each holding its
process's lock shared for `--spare-s` from its launch (`spares.Spares`: until the child is ready), one replaced after
every evaluation as a taken spare is. It runs one process with every evaluation, then two with half each, for each
`--spare-s`, and prints the wall time of each and the timings' waits for the lock.

Why: on an H100 (session 43, results/scaleout_h100_shared_s43.md) one evaluator process ran 6 rmsnorm evaluations in
239 s and two processes on the same GPU had not finished 6 after 320 s. A spare's start there held the lock for
~25 s (results/eval_rate_h100_attention_s40.md: launch 2.9 s, warm_device 21.4 s, the latter lengthened by the
pauses of its own process's timings) against ~10 s an evaluation. The model asks whether holds that long can, by
themselves, make two processes slower than one, and what a hold as long as a start's device work alone would do.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _process(path: str, evals: int, spare_s: float, probes_s: float, timing_s: float, depth: int, out) -> None:
    from tik_kernels.evaluator.devlock import DeviceLock

    lock = DeviceLock(Path(path))
    waits: list[float] = []

    def spare() -> None:
        with lock.shared():
            time.sleep(spare_s)

    def start_spare() -> None:
        if spare_s > 0:
            threading.Thread(target=spare, daemon=True).start()

    t0 = time.monotonic()
    for _ in range(depth):
        start_spare()
    for _ in range(evals):
        with lock.shared():
            time.sleep(probes_s)
            with lock.exclusive() as w:
                waits.append(w["wait_s"])
                time.sleep(timing_s)
            time.sleep(probes_s / 3)
            with lock.exclusive() as w:
                waits.append(w["wait_s"])
                time.sleep(timing_s / 2)
        start_spare()
    out.put((time.monotonic() - t0, max(waits, default=0.0), sum(waits)))


def run(processes: int, evals: int, spare_s: float, probes_s: float, timing_s: float, depth: int) -> dict:
    """`processes` model processes on one lock, `evals` evaluations in all: the slowest one's wall time."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        q = ctx.Queue()
        procs = [ctx.Process(target=_process, args=(str(Path(tmp) / "GPU-model.lock"), evals // processes, spare_s,
                                                     probes_s, timing_s, depth, q)) for _ in range(processes)]
        for p in procs:
            p.start()
        rows = [q.get() for _ in procs]
        for p in procs:
            p.join()
    return {"processes": processes, "spare_s": spare_s, "wall_s": round(max(r[0] for r in rows), 2),
            "max_wait_s": round(max(r[1] for r in rows), 2), "total_wait_s": round(sum(r[2] for r in rows), 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--evals", type=int, default=8)
    p.add_argument("--probes-s", type=float, default=0.3)
    p.add_argument("--timing-s", type=float, default=0.3)
    p.add_argument("--spare-s", type=float, nargs="+", default=[2.0, 0.35, 0.0])
    p.add_argument("--depth", type=int, default=2)
    args = p.parse_args(argv)
    print("`" + " ".join(["python benchmarks/devlock_model.py", *(sys.argv[1:] if argv is None else argv)]) + "`")
    print(f"{args.evals} evaluations: probes {args.probes_s} s, timing {args.timing_s} s, {args.depth} spares a "
          "process\n")
    print("| spare's hold s | processes | wall s | longest wait s | waits in all s |\n|---|---|---|---|---|")
    for spare_s in args.spare_s:
        for n in (1, 2):
            r = run(n, args.evals, spare_s, args.probes_s, args.timing_s, args.depth)
            print(f"| {spare_s} | {n} | {r['wall_s']} | {r['max_wait_s']} | {r['total_wait_s']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
