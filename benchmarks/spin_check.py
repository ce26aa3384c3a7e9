"""How long the evaluator's launch-hiding spin really lasts on this GPU, old calibration vs new.

    PYTHONPATH=. python benchmarks/spin_check.py

The old calibration timed one 200k-cycle spin on a cold GPU (first launch of the spin kernel, idle
clock); the new one (tik_kernels.evaluator.timing.Timer) loads the kernel first, raises the clock and
keeps the fastest of three rates. Each resulting spin is then timed on a warm GPU, where the timed
calls run: it must last at least timing.SPIN_US for the host's launch to stay hidden.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tik_kernels.evaluator import timing  # noqa: E402


def main() -> None:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    torch.cuda._sleep(200_000)
    b.record()
    torch.cuda.synchronize()
    old = max(1000, int(200_000 * timing.SPIN_US / max(a.elapsed_time(b) * 1e3, 1.0)))
    new = timing.Timer("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "target_us": timing.SPIN_US, "new_calibration_spin_us": new.spin_us}
    for name, cycles in (("old", old), ("new", new.spin_cycles)):
        warm = []
        for _ in range(5):
            torch.cuda._sleep(20_000_000)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            torch.cuda.synchronize()
            warm.append(a.elapsed_time(b) * 1e3)
        out[name] = {"cycles": cycles, "warm_us": sorted(warm)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
