"""Every operator's contract, "gpu" profile, on the library's root implementation, on this GPU.

Runs in-process (the roots are trusted library code) and saves every check's result, so the
bitwise claims in the docs point at a file:

    PYTHONPATH=. python benchmarks/gpu_contracts.py --out benchmarks/results [--ops rmsnorm linear ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from tik_kernels.contract import run_plan  # noqa: E402
from tik_kernels.contracts import all_contracts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--ops", nargs="*")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--profile", default="gpu")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    import triton

    doc = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "python": platform.python_version(), "profile": args.profile, "ops": {}}
    failed = 0
    args.out.mkdir(parents=True, exist_ok=True)
    name = "contracts_h200.json" if device == "cuda" else "contracts_cpu.json"
    for op, c in all_contracts().items():
        if args.ops and op not in args.ops:
            continue
        mod = importlib.import_module(c.impl)
        per_seed = {}
        for seed in args.seeds:
            t = time.time()
            try:
                results = run_plan(c.plan(args.profile, seed), mod, mod, device)
                checks = [r.as_dict() for r in results]
            except Exception as e:  # a broken plan is a result too, not a crash of the whole run
                checks = [{"name": "plan", "requirement": "plan", "passed": False,
                           "detail": f"{type(e).__name__}: {e}"[:300], "max_diff": None}]
            bad = [x for x in checks if not x["passed"]]
            failed += len(bad)
            per_seed[seed] = {"passed": not bad, "n_checks": len(checks), "failed": bad, "seconds": time.time() - t,
                              "checks": checks}
            print(f"{op} seed {seed}: {len(checks) - len(bad)}/{len(checks)} checks passed in {time.time() - t:.1f}s"
                  + "".join(f"\n   FAIL {x['name']}: {x['detail']}" for x in bad), flush=True)
        doc["ops"][op] = per_seed
        (args.out / name).write_text(json.dumps(doc, indent=1, default=str))  # after every op: a cut run keeps it
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
