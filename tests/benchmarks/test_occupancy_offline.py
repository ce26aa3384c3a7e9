"""benchmarks/occupancy_offline.py's first step: one decode step's Triton launches recorded, not run, with the GPU's
host decisions (the interpreter's own tiles and UPCAST would make the occupancy of another kernel)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "occupancy_offline.py"


def test_a_decode_steps_launches_are_recorded_with_the_gpus_decisions(tmp_path):
    out = tmp_path / "launches.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny", "--batch", "2", "--context", "8",
                          "--set", "attention.decode_short_maxnreg=128", "--record", str(out)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    launches = json.loads(out.read_text())
    kernels = {la["kernel"] for la in launches}
    assert {"_attn_decode_kernel", "_sample_logprob_kernel", "_linear_fwd_kernel"} <= kernels, kernels
    decode = next(la for la in launches if la["kernel"] == "_attn_decode_kernel")
    assert decode["constexprs"]["UPCAST"] is False and decode["constexprs"]["BLOCK_N"] == 128  # not the interpreter's
    assert decode["options"]["maxnreg"] == 128 and decode["options"].get("launch_pdl") is True
    assert all(all(p > 0 for p in la["grid"]) for la in launches)
