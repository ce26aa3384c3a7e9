"""Where the fused-dq backward's time goes: forward + backward of BWD_DQ_FUSED = 1 (128-key tiles, 8 warps, 2
stages) with its parts taken out one at a time, each timed by bench_speed's fwdbwd section against SDPA flash.

    PYTHONPATH=. python benchmarks/diag_attn_fused.py --out benchmarks/results/attn_fused_diag

Variants (all but `fused` compute a wrong dq: they are timings, not candidates):
  fused        the fused backward as it is
  no_wait      no spin for the tile's turn (the hand-over's barrier and release stay)
  no_handover  no spin, no barrier, no release: each program adds into the workspace whenever it gets there
  no_dq        nothing stored to the workspace (the compiler drops the dq dot with it): the dk/dv kernel alone
Differences between neighbours are what the wait, the hand-over and the dq read-modify-write cost.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tik_kernels" / "ops" / "attention.py"

CONFIG_EDITS = (('"BWD_DQ_FUSED": 0,', '"BWD_DQ_FUSED": 1,'), ('"DKDV_BLOCK_N": 64,', '"DKDV_BLOCK_N": 128,'))
WAIT = ("    w_ptrs = w_ptrs + _wait_turn(c_ptr, turn, INTERPRET)\n", "")
HANDOVER = ("    _pass_turn(c_ptr, turn + BN // SUB, INTERPRET)\n", "")
STORES = (("        tl.store(w_ptrs, acc, mask=m_row[:, None])\n", "        pass\n"),
          ("        tl.store(w_ptrs, acc)\n", "        pass\n"))
VARIANTS = {
    "fused": CONFIG_EDITS,
    "no_wait": CONFIG_EDITS + (WAIT,),
    "no_handover": CONFIG_EDITS + (WAIT, HANDOVER),
    "no_dq": CONFIG_EDITS + (WAIT, HANDOVER) + STORES,
}


def variant(name: str, out: Path) -> Path:
    src = SOURCE.read_text()
    for old, new in VARIANTS[name]:
        if src.count(old) != 1:
            raise SystemExit(f"diag_attn_fused: {name}: {old.strip()!r} is not in attention.py exactly once")
        src = src.replace(old, new)
    path = out / f"attention_{name}.py"
    path.write_text(src)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/attn_fused_diag"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: the variants load and run")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in VARIANTS:
        path = variant(name, args.out)
        cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_speed.py"), "--only", "fwdbwd", "--impl",
               f"attention={path}", "--out", str(args.out / name), "--rounds", str(args.rounds)]
        print(f"== {name}", flush=True)
        subprocess.run(cmd + (["--smoke"] if args.smoke else []), check=False)


if __name__ == "__main__":
    main()
