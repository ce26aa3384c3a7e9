"""The trusted evaluator against planted bad candidates (tests/evaluator/fixtures/), on the tiny
test-only contract so each child costs one interpreter start. The independent evaluations run
concurrently in one module-scoped fixture; each test then asserts on its own report."""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from evaluator_fixtures import FIX, tiny

from tik_kernels.evaluator import evaluate
from tik_kernels.evaluator.sandbox import child_env

TIMEOUT = 20.0
LOOP_TIMEOUT = 8.0


def run(name: str | Path, **kw):
    path = name if isinstance(name, Path) else FIX / f"{name}.py"
    kw.setdefault("timeout", TIMEOUT)
    t0 = time.monotonic()
    rep = evaluate(tiny(), path, root_path=FIX / "tiny_root.py", device="cpu", **kw)
    rep.wall = time.monotonic() - t0
    return rep


PLANTED = ["good", "exits", "segfault", "import_error", "no_entry", "batch_dependent", "mutates", "subclass",
           "strided", "wrong_dtype", "aliases", "zeros", "nans", "cached", "patches_equal", "forges", "patches_timer"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sources")
    (tmp / "syntax.py").write_text("def scale(x, w)\n    return x * w\n")
    (tmp / "binary.py").write_bytes(bytes(range(256)) * 4)
    jobs = {name: (name, {}) for name in PLANTED if name != "good"}
    jobs["loop"] = ("loop", {"timeout": LOOP_TIMEOUT})
    jobs["syntax"] = (tmp / "syntax.py", {})
    jobs["binary"] = (tmp / "binary.py", {})
    jobs["good_timed"] = ("good", {"time_it": True})
    jobs["lazy_when_timed"] = ("lazy_when_timed", {"time_it": True})
    jobs["large_t_switch"] = ("large_t_switch", {"time_it": True})
    # the root's own results first, so concurrent evaluations share one root child
    done = {"good": run("good")}
    with ThreadPoolExecutor(max_workers=3) as ex:
        futs = {k: ex.submit(run, src, **kw) for k, (src, kw) in jobs.items()}
        return done | {k: f.result() for k, f in futs.items()}


def failed_requirements(rep) -> set[str]:
    return {c.requirement for c in rep.checks if not c.passed}


def test_good_candidate_is_verified(reports):
    rep = reports["good"]
    assert rep.verified, rep.failure
    d = rep.as_dict()
    assert d["failure"] is None and d["cells"] == [] and d["admissible"] is None
    names = {c["name"] for c in d["checks"]}
    assert {"tiny/root_bits", "tiny/accuracy", "output_spec", "inputs_unchanged[all probes]"} <= names
    assert len(d["source_sha256"]) == 64 and d["contract_fingerprint"] and d["evaluator_fingerprint"]
    assert d["env"]["device"] == "cpu" and d["env"]["torch"] == torch.__version__ and d["env"]["python"]


@pytest.mark.parametrize("name,reason", [
    ("exits", "exited with status 3"),
    ("segfault", "crashed with signal SIGSEGV"),
    ("import_error", "import failed: RuntimeError: this module refuses to load"),
    ("no_entry", "entry point scale() missing"),
    ("syntax", "syntax error"),
    ("binary", "not a Python source file"),
    ("subclass", "output 0 is Sneaky, not a plain torch.Tensor"),
    ("strided", "output 0 is not contiguous"),
    ("aliases", "output 0 aliases an input"),
    ("forges", "protocol error"),
    ("patches_timer", "the source references the evaluator ('tik_kernels.evaluator')"),
])
def test_broken_candidate_fails_with_reason(reports, name, reason):
    rep = reports[name]
    assert not rep.verified
    assert reason in rep.failure, rep.failure
    assert "\n" not in rep.failure and len(rep.failure) <= 300
    assert rep.as_dict()["checks"] and not all(c.passed for c in rep.checks)


def test_infinite_loop_is_killed_within_timeout(reports):
    rep = reports["loop"]
    assert not rep.verified
    assert rep.failure == f"timed out after {LOOP_TIMEOUT:g} s (killed)"
    assert rep.wall < LOOP_TIMEOUT + 5


@pytest.mark.parametrize("name,requirement,words", [
    ("batch_dependent", "batch_invariance", "elements differ"),
    ("mutates", "inputs_unchanged", "input mutated"),
    ("wrong_dtype", "output_spec", "float32"),
    ("zeros", "accuracy", "rel_rms 1"),
    ("nans", "accuracy", "rel_rms inf"),
    ("cached", "batch_invariance", "elements differ"),
    ("patches_equal", "accuracy", "rel_rms 1"),
])
def test_wrong_candidate_fails_the_right_requirement(reports, name, requirement, words):
    rep = reports[name]
    assert not rep.verified
    bad = [c for c in rep.checks if not c.passed and c.requirement == requirement]
    assert bad, f"{requirement} did not fail: {rep.failure}"
    assert any(words in c.detail for c in bad), [c.detail for c in bad]


def test_mutation_is_the_only_failure_of_the_mutating_candidate(reports):
    assert failed_requirements(reports["mutates"]) == {"inputs_unchanged"}


def test_wrong_dtype_passes_invariance_but_not_the_spec(reports):
    rep = reports["wrong_dtype"]
    assert "batch_invariance" not in failed_requirements(rep)
    assert "output_spec" in failed_requirements(rep)


def test_patching_torch_in_the_child_does_not_reach_the_parent(reports):
    assert not reports["patches_equal"].verified
    assert torch.equal(torch.zeros(3), torch.ones(3)) is False


def test_good_candidate_timed_on_cpu_is_marked_interpreter(reports):
    rep = reports["good_timed"]
    assert rep.verified, rep.failure
    d = rep.as_dict()
    assert d["timing"] == "interpreter" and d["env"]["interpreter"] is True
    assert [c["cell"] for c in d["cells"]] == ["tiny[T=8]", "tiny[T=32]"]
    for c in d["cells"]:
        assert c["samples"] == 5 and c["median_us"] > 0 and c["root_median_us"] > 0 and c["baseline_median_us"] > 0
        assert c["ratio_vs_root"] == pytest.approx(c["median_us"] / c["root_median_us"])
    assert d["objective"] == pytest.approx(sum(c["coeff"] * c["median_us"] for c in d["cells"]))
    assert d["admissible"] is not None and d["eligible"] is not None
    assert any(c["name"] == "timing/outputs" and c["passed"] for c in d["checks"])
    assert any(c["name"] == "timing/rows" and c["passed"] and c["detail"] == "2 cells passed" for c in d["checks"])
    assert all(c["rounds"] == 5 for c in d["cells"])
    # where the time went: each child's run, as the parent saw it
    assert {"probes_candidate", "checks", "timing_child"} <= set(d["phases"])
    assert 0 < d["phases"]["timing_child"] < d["elapsed_s"]


def test_timing_rounds_stop_at_the_cell_budget_past_the_minimum(tmp_path):
    from tik_kernels.evaluator.timing import run_timing_job

    (tmp_path / "out").mkdir()
    job = {"op": tiny().op, "contract_file": str(FIX / "tiny_contract.py"), "profile": "cpu", "seed": 0,
           "device": "cpu", "impls": [["root", str(FIX / "tiny_root.py")], ["candidate", str(FIX / "good.py")]],
           "cells": [c.name for c in tiny().cells("cpu")], "reps": 40, "warmup": 1, "variants": 2,
           "min_reps": 3, "cell_budget_s": 0.0}
    doc = run_timing_job(tmp_path, job)
    for c in doc["cells"].values():
        assert c["rounds"] == 3 and all(len(s["event_us"]) == 3 for s in c["samples"].values())
        assert c["seconds"]["timed"] >= 0 and c["seconds"]["warmup"] >= 0
    doc = run_timing_job(tmp_path, {**job, "cell_budget_s": None, "reps": 7})
    assert all(c["rounds"] == 7 for c in doc["cells"].values())
    # a cell whose rounds are long (every round here: long_round_s 0) stops from min_reps_long on, a short one
    # (long_round_s far above a round) from min_reps; here at the budget, spent from the first round on
    long = {**job, "min_reps": 12, "min_reps_long": 4, "long_round_s": 0.0}
    assert all(c["rounds"] == 4 for c in run_timing_job(tmp_path, long)["cells"].values())
    assert all(c["rounds"] == 12 for c in run_timing_job(tmp_path, {**long, "long_round_s": 1e9})["cells"].values())


def test_candidate_lazy_when_timed_fails_the_timed_output_check(reports):
    rep = reports["lazy_when_timed"]
    assert not rep.verified
    bad = [c for c in rep.checks if not c.passed]
    # stale timed outputs: wrong against the reference, and unlike the same rows computed again
    assert [c.name for c in bad] == ["timing/outputs", "timing/rows"], rep.failure
    assert "timed call on input variant" in bad[0].detail
    # the same file passes every contract check when it is not being timed
    assert all(c.passed for c in rep.checks if not c.name.startswith("timing/"))


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Evaluations under their own temp root, with fake secrets in the parent's environment."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "fake")
    monkeypatch.setenv("DB_PASSWORD", "fake")
    return tmp_path


def test_nosy_candidate_finds_no_secrets_and_no_files(private_tmp):
    from tik_kernels.evaluator.spares import SPARES

    (private_tmp / "tik-eval-decoy").mkdir()  # another evaluation's directory: outside the jail
    taken = SPARES.stats["taken"]
    for _ in range(2):  # the second in the child pre-started while the first ran (`Spares`), untimed as a search is
        rep = run("nosy")
        assert rep.verified, rep.failure
        # every child's directory is gone; what may be left is this process's, not a child's: the next candidate's
        # pre-started child, which has run nothing yet, and the plan's inputs file, kept for the process's life
        # (`core._link_inputs`: it is there when this test runs first)
        assert sorted(p.name for p in private_tmp.iterdir()
                      if not p.name.startswith(("tik-spare-", "tik-inputs-"))) == ["tik-eval-decoy"]
    assert SPARES.stats["taken"] > taken


def test_nosy_candidate_would_report_what_it_finds(private_tmp):
    (private_tmp / "tik-eval-decoy").mkdir()
    rep = run("nosy", sandbox=False)  # without the jail the directory next door is in sight
    assert not rep.verified
    # (and this process's next pre-started child and kept inputs, when they exist: tik-spare-*, tik-inputs-*)
    assert "found other evaluations ['tik-eval-decoy'" in rep.failure


def test_child_environment_is_scrubbed(monkeypatch, tmp_path):
    for k in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "GH_TOKEN", "AWS_SECRET_ACCESS_KEY",
              "db_password", "SOME_CREDENTIALS"):
        monkeypatch.setenv(k, "x")
    monkeypatch.setenv("HARMLESS", "1")
    env = child_env("cpu", tmp_path)
    leaked = [k for k in env if any(w in k.upper() for w in ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"))
              or k.startswith("ANTHROPIC")]
    assert leaked == []
    assert env["HARMLESS"] == "1" and env["TRITON_INTERPRET"] == "1" and env["TMPDIR"] == str(tmp_path)


def test_a_cpu_child_runs_one_openmp_thread_unless_the_user_chose(monkeypatch, tmp_path):
    """The interpreter's children on one OpenMP / BLAS thread: idle pool threads spin on the cores other evaluation
    processes need. A user's OMP_NUM_THREADS stands; GPU children keep the parent's setting."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert child_env("cpu", tmp_path)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in child_env("cuda", tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_env("cpu", tmp_path)["OMP_NUM_THREADS"] == "3"


def test_unknown_operator_is_the_callers_error():
    from tik_kernels.contracts import UnknownOperator

    with pytest.raises(UnknownOperator):
        evaluate("no_such_op", FIX / "good.py")



def test_only_trusted_children_write_the_shared_triton_cache_and_seeded_ones_get_a_private_copy(tmp_path,
                                                                                               monkeypatch):
    """GPU children compile into a Triton cache: the root's (trusted) into the process's shared one, every
    other child into a private copy of it. A candidate that plants or deletes files there touches only its copy."""
    from tik_kernels.evaluator import sandbox
    from tik_kernels.evaluator.protocol import TensorWriter
    from tik_kernels.evaluator.spawn import run_child

    impl = tmp_path / "cache_toucher.py"
    impl.write_text(
        "import os, pathlib\n"
        "d = pathlib.Path(os.environ['TRITON_CACHE_DIR'])\n"
        "d.mkdir(parents=True, exist_ok=True)\n"
        "seen = sorted(p.name for p in d.iterdir())\n"
        "for p in d.iterdir():\n"
        "    p.unlink()\n"
        "(d / 'planted').write_text('by a child')\n"
        "raise RuntimeError('seen:' + ' '.join(seen))\n")  # the report's import error says what it saw

    def inputs(tmp):
        return {"probes": [], "tensors": TensorWriter(tmp / "inputs.bin").close()}

    def run(mode):
        job = {"mode": "probes", "impl": str(impl), "device": "cpu", "limits": sandbox.limits(20),
               "graph_probes": []}
        out = run_child(job, inputs, lambda out, doc: doc, 20.0, cache=mode)
        assert out.failure is None, out.failure
        return out.doc["import_error"].partition("seen:")[2]

    shared = sandbox.trusted_cache_dir()
    (shared / "root-kernel.cubin").write_text("compiled by the root")
    # sees the root's file in its copy, deletes it there, plants its own there
    assert run("seeded") == "root-kernel.cubin"
    assert sorted(p.name for p in shared.iterdir()) == ["root-kernel.cubin"]
    assert run("private") == ""
    assert sorted(p.name for p in shared.iterdir()) == ["root-kernel.cubin"]
    # the root's child: its writes land in the shared directory
    assert run("trusted") == "root-kernel.cubin"
    assert [p.name for p in shared.iterdir()] == ["planted"]
    with pytest.raises(ValueError, match="cache mode"):
        sandbox.triton_cache("shared", tmp_path)


def test_unchanged_inputs_are_named_not_sent_back_and_a_mutation_still_crosses(tmp_path):
    """The child names an input it left bitwise as sent ({"input": k}); the parent then holds the very tensor
    it sent. A mutated input comes back as bytes, so the inputs_unchanged check sees the change."""
    from tik_kernels.contract import Plan, Probe
    from tik_kernels.evaluator.core import run_probes

    x, w = torch.randn(4, 8), torch.ones(8)
    plan = Plan()
    plan.add(Probe("a", "rmsnorm", (x, w)))
    plan.add(Probe("b", "rmsnorm", (x[:2].clone(), w)))  # w shared: written once, named twice
    honest = tmp_path / "honest.py"
    honest.write_text("def rmsnorm(x, w, eps=1e-6):\n    return x * w\n")
    res, failure = run_probes(plan, honest, "cpu", timeout=60)
    assert failure is None
    assert res["a"].inputs_after[0] is x and res["a"].inputs_after[1] is w and res["b"].inputs_after[1] is w
    mutating = tmp_path / "mutating.py"
    mutating.write_text("def rmsnorm(x, w, eps=1e-6):\n    w.add_(1)\n    return x * w\n")
    res, failure = run_probes(plan, mutating, "cpu", timeout=60)
    assert failure is None and res["a"].inputs_after[0] is x
    assert res["a"].inputs_after[1] is not w and torch.equal(res["a"].inputs_after[1], w + 1)


def test_a_plan_is_built_once_per_contract_profile_and_seed():
    from tik_kernels.contracts import get_contract
    from tik_kernels.evaluator.core import plan_for

    c = get_contract("rmsnorm")
    a = plan_for(c, "cpu", 0)
    assert plan_for(c, "cpu", 0) is a and plan_for(c, "cpu", 1) is not a
    # two plans are kept: the first is still there after the second
    assert plan_for(c, "cpu", 0) is a


def test_a_switch_above_the_probed_token_counts_fails_the_timed_rows_check(reports):
    """Every timed shape is bit-checked: the candidate is right at every token count the probes use and takes
    another path only at the T = 32 timed cell; its timed rows, computed again alone, differ."""
    rep = reports["large_t_switch"]
    bad = {c.name: c.detail for c in rep.checks if not c.passed}
    assert not rep.verified and list(bad) == ["timing/rows"], bad
    assert bad["timing/rows"].startswith("tiny[T=32]: ") and "differ from the same rows of the timed call" in \
        bad["timing/rows"], bad
