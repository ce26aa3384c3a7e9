"""Launch twins in the saved linear sweeps: each candidate of 64 rows or more (a wgmma tile on Hopper) with K_UNROLL 2
beside its twin with K_UNROLL 1 (the same tile, warps, stages, split and combine), per sweep and bucket, as the
geomean ratios to cuBLAS each sweep measured in one run.

    python benchmarks/sweep_twins.py [--out FILE] [SWEEP_DIR ...]   (default: benchmarks/results/linear_sweep_*/)

Compiled for sm_90 by Triton 3.6, such a tile waits for each wgmma once a loop iteration holds two dots
(`benchmarks/linear_offline.py`); this reads whether the GPUs timed it slower.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def twins(choice: dict, run_config: dict | None = None) -> list[tuple[str, str, float, float]]:
    """(bucket, K_UNROLL 2 launch, its geomean, its K_UNROLL 1 twin's geomean) in one sweep's `choice`; a bucket its
    run swapped (`run_config` <bucket>_SWAP 1) is left out: a swapped launch takes K_UNROLL 1 whatever its label says,
    so there the twins are one launch."""
    out = []
    for bucket, c in choice.items():
        if (run_config or {}).get(f"{bucket}_SWAP"):
            continue
        scores = c.get("all", {})
        for label, g in scores.items():
            parts = label.split(",")
            if len(parts) < 6 or not all(p.isdigit() for p in parts[:6]):
                continue
            bm, _, _, _, unroll, _ = map(int, parts[:6])
            twin = ",".join(parts[:4] + ["1"] + parts[5:])
            if unroll == 2 and bm >= 64 and twin in scores:
                out.append((bucket, label, g, scores[twin]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="*", type=Path, help="sweep folders (each with sweep.json)")
    ap.add_argument("--out", type=Path, default=None, help="also write the lines to this file")
    args = ap.parse_args()
    dirs = args.sweeps or sorted(p.parent for p in (ROOT / "benchmarks" / "results").glob("linear_sweep_*/sweep.json"))
    missing = [str(d) for d in dirs if not (d / "sweep.json").is_file()]
    if missing:
        ap.error(f"no sweep.json in {', '.join(missing)}")
    lines = ["sweep | bucket | launch (K_UNROLL 2) | geomean / cuBLAS | K_UNROLL 1 twin | 2 over 1"]
    slower = total = 0
    for d in dirs:
        doc = json.loads((d / "sweep.json").read_text())
        for bucket, label, g2, g1 in twins(doc.get("choice", {}), doc.get("run_config")):
            total += 1
            slower += g2 > g1
            lines.append(f"{d.name} | {bucket} | {label} | {g2:.3f} | {g1:.3f} | {g2 / g1:.3f}")
    lines.append(f"{slower} of {total} K_UNROLL 2 launches slower than their K_UNROLL 1 twins")
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
