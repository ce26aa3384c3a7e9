"""Benchmark scripts import `benchmarks.harness` from the repository root, as they do when run from it."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
