"""GPU: every library root passes the evaluator on cuda; the tiny contract's planted cheats are caught there too.

Timed samples are CUDA-graph replays, so work on a side stream buys no speed; the eager side-stream cheats
(one kernel, fifty, half a millisecond of matmuls) are still rejected by the profiled call's window (kernels
that end after the timed stream passed its end event), a lazy-when-timed one by the profiled call that ran no
kernel, a switch above the probed token counts by the timed rows computed again, a cache by input address
by the CUDA-graph replay check, and a call that copies the previous call's output inside a capture (a sample of
a microsecond cell replays several calls) by the timed outputs.
"""

from __future__ import annotations

import pytest
from evaluator_fixtures import FIX, tiny

from tik_kernels.contract import late
from tik_kernels.contracts import all_contracts
from tik_kernels.evaluator import evaluate

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("op", list(all_contracts()))
def test_library_root_passes_on_gpu(op):
    c = all_contracts()[op]
    rep = evaluate(op, c.root_path, device="cuda", timeout=600, time_it=False)
    assert rep.verified, rep.failure


@pytest.mark.gpu_timing
@pytest.mark.parametrize("op", ["linear", "attention", "rmsnorm"])
def test_library_root_timed_as_a_candidate_on_gpu(op):
    """The root as its own candidate, timed at every cell of the GPU plan: what a tuner's first move meets. The
    test above skips the timing, and until session 34 none timed a library root, so two faults that failed every
    linear and attention candidate went unseen from session 20 on (results/eval_rate_h100_s34.md): the integrity
    check summed the durations of kernels that programmatic dependent launch overlaps on one stream, and the timing
    child held 2 x variants + 1 copies of a cell's inputs (attention's 32k decode: 69 GB on an 80 GB card)."""
    c = all_contracts()[op]
    rep = evaluate(op, c.root_path, device="cuda", timeout=900, time_it=True)
    assert rep.verified, rep.failure


@pytest.mark.gpu_timing
def test_good_candidate_timed_on_gpu():
    rep = evaluate(tiny(), FIX / "good.py", root_path=FIX / "tiny_root.py", device="cuda", time_it=True)
    assert rep.verified, rep.failure
    d = rep.as_dict()
    assert d["timing"] == "gpu" and d["env"]["gpu"] and d["floor_us"] is not None
    assert any(c["name"] == "timing/integrity" and c["passed"] for c in d["checks"])
    assert any(c["name"] == "cuda_graph_replay" and c["passed"] for c in d["checks"])
    assert any(c["name"] == "timing/rows" and c["passed"] and c["detail"] == "2 cells passed" for c in d["checks"])
    assert all(c["median_us"] > 0 and c["baseline_median_us"] > 0 for c in d["cells"])
    assert all(c["timing"] == "graph" for c in d["cells"]), [c.get("graph_note") for c in d["cells"]]
    # the tiny contract's cells are microseconds: several calls a sample, over several graph instances
    from tik_kernels.evaluator import measure

    assert all(c["calls"] > 1 and c["graph_instances"] == measure.GPU_GRAPH_INSTANCES for c in d["cells"]), d["cells"]


@pytest.mark.gpu_timing
@pytest.mark.parametrize("name,check,reason", [
    ("side_stream", "timing/integrity", "escapes the timing events"),
    ("side_stream_small", "timing/integrity", "escapes the timing events"),
    ("side_stream_large", "timing/integrity", "escapes the timing events"),
    ("lazy_gpu", "timing/integrity", "no GPU kernel ran during a profiled call"),
    ("large_t_switch", "timing/rows", "differ from the same rows of the timed call"),
    ("repeats_in_capture", "timing/outputs", "timed call on input variant"),
])
def test_timing_cheat_caught_on_gpu(name, check, reason):
    rep = evaluate(tiny(), FIX / f"{name}.py", root_path=FIX / "tiny_root.py", device="cuda", time_it=True)
    assert not rep.verified
    bad = {c.name: c.detail for c in rep.checks if not c.passed}
    if name == "side_stream_large" and "cuda_graph_replay" in bad:
        # H200: its 0.5 ms of side-stream work is still running when the replay check reads a fresh call's output,
        # so that check rejects it first ("replay ... differs from a fresh call"); rejected either way, reason kept
        return
    if name == "lazy_gpu" and late.active("cuda") and any("differ" in d for d in bad.values()):
        # with late inputs every probe's call finds the stream busy (the writers hold until it has returned), so the
        # lazy candidate returns a stale output there and the probes' checks reject it before its timing
        return
    assert check in bad and reason in bad[check], rep.failure


def test_address_cache_fails_graph_replay(tmp_path):
    src = (FIX / "good.py").read_text() + (
        "\n_cache = {}\n_honest = scale\n\n\ndef scale(x, w):\n"
        "    key = (x.data_ptr(), w.data_ptr(), tuple(x.shape))\n"
        "    if key not in _cache:\n        _cache[key] = _honest(x, w)\n    return _cache[key]\n")
    (tmp_path / "address_cache.py").write_text(src)
    rep = evaluate(tiny(), tmp_path / "address_cache.py", root_path=FIX / "tiny_root.py", device="cuda", time_it=False)
    assert not rep.verified
    assert any(c.name == "cuda_graph_replay" and not c.passed for c in rep.checks), rep.failure


_TWO_PROCESSES = """
import json, sys
sys.path.insert(0, sys.argv[1])
from evaluator_fixtures import FIX, tiny
from tik_kernels.evaluator import evaluate
rep = evaluate(tiny(), FIX / "good.py", root_path=FIX / "tiny_root.py", device="cuda", time_it=True)
print(json.dumps({"verified": rep.verified, "failure": rep.failure,
                  "device_wait": rep.phases.get("device_wait"), "gave_up": rep.phases.get("device_wait_gave_up")}))
"""


@pytest.mark.gpu_timing
def test_two_processes_on_one_gpu_take_turns(tmp_path):
    """Two evaluator processes on one GPU at once (two searches, or `tik bench` beside a search): each timing waits
    for the other's GPU work (`devlock`), both candidates verify, neither is failed for the other's load."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TIK_DEVICE_LOCK_DIR": str(tmp_path / "locks"), "TIK_PRESTART": "0"}
    here = str(Path(__file__).resolve().parent)
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESSES, here], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    docs = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert all(d["verified"] for d in docs), (docs, [o[1][-2000:] for o in outs])
    assert not any(d["gave_up"] for d in docs)
    assert all(d["device_wait"] is not None for d in docs)
