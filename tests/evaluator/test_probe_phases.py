"""Where a probes phase goes (`core.probe_phases`: the parent's parts and the child's own), and the inputs file of a
kept plan: written once per process, linked read-only into each jailed child, copied for an unconfined one."""

from __future__ import annotations

import hashlib

import pytest
from evaluator_fixtures import FIX, tiny

from tik_kernels.evaluator import core, evaluate, sandbox

ROOT = FIX / "tiny_root.py"


def test_a_probes_phase_is_broken_down_by_the_parent_and_the_child():
    rep = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", time_it=False, timeout=60)
    assert rep.verified, rep.failure
    ph = rep.phases
    parts = ["probes_candidate_" + k for k in ("start", "inputs", "wait_other", "read")]
    parts += ["probes_candidate_child_" + k for k in core.CHILD_PHASES]
    assert set(parts) <= set(ph), sorted(ph)
    # the child's parts are its own clock's: what it reported, inside the parent's wait
    assert ph["probes_candidate_child_compute"] > 0 and ph["probes_candidate_child_send"] > 0
    assert sum(ph[k] for k in parts) <= ph["probes_candidate"] + 0.05
    assert ph["probes_candidate_in_mb"] > 0 and ph["probes_candidate_out_mb"] > 0
    # the root's probes (run for the checks) are broken down the same way
    assert "probes_root_child_compute" in ph or "probes_root" not in ph


def test_what_the_child_says_of_its_time_is_kept_only_when_it_is_a_number_of_seconds():
    told = {"compute": 1.5, "send": -1, "graph": float("nan"), "inputs": "fast", "evil": 3.0, "import": True,
            "start": 2}
    ph = core.probe_phases({"start": 0.1, "inputs": 0.2, "wait": 5.0, "read": 0.3},
                           {"child": told, "in_bytes": 2_000_000, "out_bytes": 0}, "p")
    assert {k: v for k, v in ph.items() if k.startswith("p_child_")} == {"p_child_compute": 1.5, "p_child_start": 2.0}
    assert ph["p_wait_other"] == pytest.approx(1.5) and ph["p_in_mb"] == 2.0 and ph["p_read"] == 0.3
    # a child that claims more than the parent waited leaves no negative remainder; a report that is no dict, nothing
    assert core.probe_phases({"wait": 1.0}, {"child": {"compute": 9.0}}, "p")["p_wait_other"] == 0.0
    assert not [k for k in core.probe_phases({"wait": 1.0}, {"child": [1, 2]}, "p") if "child" in k]


#: an implementation that says which inputs file it got (its inode) and whether it could write it, as its import error
PEEK = """import json, os
job = json.load(open(os.path.join(os.environ["TMPDIR"], "job.json")))
path = job["inputs"]
try:
    with open(path, "r+b") as f:
        f.write(b"tampered")
    wrote = "wrote"
except OSError as e:
    wrote = type(e).__name__
raise RuntimeError(f"seen:{os.stat(path).st_ino}:{wrote}")
"""


def _peek(plan, impl) -> tuple[str, str]:
    res, failure = core.run_probes(plan, impl, "cpu", 60)
    assert res is None and "seen:" in failure, failure
    ino, wrote = failure.rpartition("seen:")[2].split(":")
    return ino, wrote


@pytest.mark.parametrize("jailed", [True, False])
def test_a_kept_plans_inputs_are_written_once_and_no_child_can_change_them_for_the_next(tmp_path, jailed):
    """Jailed: every child gets a link to the one file, on a read-only mount (its write fails). Unconfined
    (sandbox=False): a copy, which it may write; the kept file, and so the next child's inputs, stay as they were."""
    if jailed and sandbox.availability()[0] is None:
        pytest.skip("the jail does not start here")
    impl = tmp_path / "peek.py"
    impl.write_text(PEEK)
    plan = core.plan_for(tiny(), "cpu", 0)
    with sandbox.policy(jailed):
        first = _peek(plan, impl)
        kept = core._INPUTS[id(plan)].path
        before = hashlib.sha256(kept.read_bytes()).hexdigest()
        second = _peek(plan, impl)
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == before
    if jailed:
        assert first[0] == second[0] == str(kept.stat().st_ino)  # one file, linked
        assert first[1] != "wrote" and second[1] != "wrote", (first, second)
    else:
        assert first[1] == second[1] == "wrote"
        assert str(kept.stat().st_ino) not in (first[0], second[0])  # copies
    # and an honest candidate after them gets the plan's inputs as they are
    rep = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", time_it=False, timeout=60, sandbox=jailed)
    assert rep.verified, rep.failure


def test_a_plan_dropped_from_the_process_takes_its_inputs_file_with_it():
    plan = core.plan_for(tiny(), "cpu", 0)
    core._link_inputs(plan, core.owned_tempdir("tik-test-") / "inputs.bin")
    kept = core._INPUTS[id(plan)].path
    assert kept.exists()
    core.plan_for(tiny(), "cpu", 1)
    core.plan_for(tiny(), "cpu", 2)  # two plans are kept: the first is dropped now
    assert not kept.exists() and id(plan) not in core._INPUTS


@pytest.mark.gpu
def test_on_the_gpu_a_spare_has_warmed_triton_before_its_candidate_arrives(monkeypatch):
    """A pre-started CUDA child has paid Triton's once-per-process costs (`child.warm_triton`): the candidate taken
    by it finds Triton's version key computed already."""
    monkeypatch.setenv(sandbox.PRESTART_ENV, "1")
    pool = sandbox.Spares()
    monkeypatch.setattr(sandbox, "SPARES", pool)
    try:
        first = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cuda", time_it=True, timeout=120)
        assert first.verified, first.failure
        rep = evaluate(tiny(), FIX / "triton_warm.py", root_path=ROOT, device="cuda", time_it=True, timeout=120)
        assert "warm:1" in (rep.failure or ""), rep.failure
    finally:
        pool.close()
