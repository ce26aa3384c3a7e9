"""The root's CPU probe results shared by the evaluator processes of one search (`core.ROOT_SHARE`): computed once,
by the first process that needs them, under a lock the others wait on; read back bitwise as computed; an entry that
cannot be read is computed again, never trusted."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from evaluator_fixtures import FIX, tiny

from tik_kernels.contract import ProbeResult
from tik_kernels.evaluator import core, evaluate
from tik_kernels.evaluator.core import _root_key, _shared_root, plan_for, source_problem

ROOT = FIX / "tiny_root.py"


def _results(plan) -> dict[str, ProbeResult]:
    """Stand-in root results, one per probe: outputs, echoed inputs on some, an error on one."""
    out = {}
    for k, p in enumerate(plan.probes):
        x = torch.arange(k, k + 12, dtype=torch.float32).view(3, 4).to(torch.bfloat16)
        out[p.id] = (ProbeResult(error="ValueError: planted") if k == 1 else
                     ProbeResult(outputs=[x, x.float() * 0.5], inputs_after=[x + 1] if k % 2 else None))
    return out


def _key(plan) -> tuple:
    return _root_key(source_problem(ROOT)[1], tiny(), "cpu", 0, "cpu")


def test_the_first_process_computes_and_writes_the_next_reads_the_same_bits(tmp_path):
    plan = plan_for(tiny(), "cpu", 0)
    want = _results(plan)
    calls = []

    def compute():
        calls.append(1)
        return want

    got, shared = _shared_root(tmp_path, _key(plan), plan, compute)
    assert got is want and not shared and len(calls) == 1
    again, shared = _shared_root(tmp_path, _key(plan), plan, compute)
    assert shared and len(calls) == 1 and set(again) == set(want)
    for pid, r in want.items():
        a = again[pid]
        assert a.error == r.error and len(a.outputs) == len(r.outputs)
        assert all(x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
                   for x, y in zip(a.outputs, r.outputs, strict=True))
        assert (a.inputs_after is None) == (r.inputs_after is None)
        if r.inputs_after is not None:
            assert all(torch.equal(x, y) for x, y in zip(a.inputs_after, r.inputs_after, strict=True))
    # another root source, contract, profile, seed or device is another entry
    other = (*_key(plan)[:3], 1, "cpu")
    _, shared = _shared_root(tmp_path, other, plan, compute)
    assert not shared and len(calls) == 2


@pytest.mark.parametrize("damage", ["truncate", "json", "probes"])
def test_an_entry_that_cannot_be_read_is_computed_again(tmp_path, damage):
    plan = plan_for(tiny(), "cpu", 0)
    want = _results(plan)
    _shared_root(tmp_path, _key(plan), plan, lambda: want)
    [meta] = tmp_path.glob("*.json")
    if damage == "truncate":
        meta.with_suffix(".bin").write_bytes(b"\0" * 8)
    elif damage == "json":
        meta.write_text("{not json")
    else:
        meta.write_text(meta.read_text().replace(plan.probes[0].id, "another probe"))
    calls = []
    got, shared = _shared_root(tmp_path, _key(plan), plan, lambda: calls.append(1) or want)
    assert got is want and not shared and calls == [1]
    _, shared = _shared_root(tmp_path, _key(plan), plan, lambda: calls.append(1) or want)
    assert shared and calls == [1]  # written again, whole


def test_processes_that_need_it_at_once_compute_it_once(tmp_path):
    plan = plan_for(tiny(), "cpu", 0)
    want = _results(plan)
    calls, started, shared = [], threading.Event(), []

    def slow():
        calls.append(1)
        started.set()
        threading.Event().wait(0.3)
        return want

    def one():
        shared.append(_shared_root(tmp_path, _key(plan), plan, slow)[1])

    first = threading.Thread(target=one)
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=one)  # asks while the first computes: waits for it, then reads
    second.start()
    first.join(10)
    second.join(10)
    assert calls == [1] and sorted(shared) == [False, True]


def test_an_evaluation_reads_the_root_another_process_computed(tmp_path, monkeypatch):
    monkeypatch.setattr(core, "ROOT_SHARE", tmp_path)
    monkeypatch.setattr(core, "_ROOT_CACHE", {})
    first = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", timeout=60)
    assert first.verified and "probes_root_shared" not in first.phases and "probes_root_child_compute" in first.phases
    core._ROOT_CACHE.clear()  # a second process of the search: nothing of the root kept in memory
    second = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", timeout=60)
    assert second.verified and second.phases["probes_root_shared"] == 1.0
    assert "probes_root_child_compute" not in second.phases
    assert [c.as_dict() for c in second.checks] == [c.as_dict() for c in first.checks]
    bad = evaluate(tiny(), FIX / "batch_dependent.py", root_path=ROOT, device="cpu", timeout=60)
    assert not bad.verified  # the shared root judges as the computed one does


def test_on_the_cpu_the_roots_probes_run_beside_the_candidates(tmp_path, monkeypatch):
    """The root's probes (not kept yet) start in their own child while the candidate's run, not after them: a root
    and a candidate that each take 3 s to import are evaluated in well under the 6 s they would take one after the
    other; a root that fails there fails the evaluation as before, with its reason."""
    monkeypatch.setattr(core, "_ROOT_CACHE", {})
    assert evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", timeout=60).verified  # the children's
    # fork server up and a spare ready, as in a running search: what is timed below is the two children
    slow = "import time\ntime.sleep(3)\n"
    root = tmp_path / "slow_root.py"
    root.write_text(slow + ROOT.read_text())
    cand = tmp_path / "slow_good.py"
    cand.write_text(slow + (FIX / "good.py").read_text())
    t0 = time.monotonic()
    rep = evaluate(tiny(), cand, root_path=root, device="cpu", timeout=60)
    took = time.monotonic() - t0
    assert rep.verified, rep.failure
    assert 3 <= took < 5.5 and rep.phases["probes_root"] >= 3 and rep.phases["probes_candidate"] >= 3, rep.phases
    assert not core._ROOT_THREADS  # joined
    broken = tmp_path / "broken_root.py"
    broken.write_text("raise ImportError('planted')\n" + ROOT.read_text())
    rep = evaluate(tiny(), FIX / "good.py", root_path=broken, device="cpu", timeout=60)
    assert not rep.verified and rep.failure.startswith("evaluator error: RuntimeError: the root implementation failed")
    assert not core._ROOT_THREADS
