"""The trusted files, hashed when the evaluator is imported and checked before and after every evaluation.

A child cannot write them (the jail mounts the runtime read-only), but another process can, between two
evaluations or during one: the parent has already imported some of these modules and the children import
them afresh, so a change would split what the checks run from what the children run. A changed, added or
removed file fails every later evaluation in this process with a one-line reason naming it (restart the
process to trust the new code).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import tik_kernels

ROOT = Path(tik_kernels.__file__).resolve().parent
#: the files an evaluation trusts: the evaluator, the contract framework, contracts, references, model shapes,
#: the runtime helpers the children import (and the interpreter's adjustments they install), and the package's own
#: __init__ (it sets TRITON_INTERPRET)
TRUSTED = ("__init__.py", "_runtime.py", "_interpreter.py", "contract/*.py", "models.py", "evaluator/*.py",
           "contracts/*.py", "reference/*.py")


def digests(root: Path | None = None) -> dict[str, str]:
    """{path relative to tik_kernels/: sha256} of every trusted file under `root` (default ROOT)."""
    root = ROOT if root is None else root
    out = {}
    for pattern in TRUSTED:
        for p in sorted(root.glob(pattern)):
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


BASELINE = digests()


def changed(baseline: dict[str, str] | None = None) -> str | None:
    """None when every trusted file is as it was at import, else a one-line reason naming what changed."""
    baseline = BASELINE if baseline is None else baseline
    try:
        now = digests()
    except OSError as e:
        return f"the evaluator's trusted files cannot be read ({e.strerror}: {e.filename})"
    diff = sorted(k for k in baseline.keys() | now.keys() if baseline.get(k) != now.get(k))
    if not diff:
        return None
    names = ", ".join(f"tik_kernels/{k}" for k in diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")
    return f"the evaluator's trusted files changed since this process started ({names}); restart to trust them"
