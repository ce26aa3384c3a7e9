"""Where a probes phase goes (`core.probe_phases`: the parent's parts and the child's own); the inputs file of a kept
plan: written once per process, linked read-only into each jailed child, copied for an unconfined one; the outputs
handed over in a sealed memfd (`protocol.SharedOutputs`): refused unless nothing can change them any more."""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket

import pytest
import torch
from evaluator_fixtures import FIX, tiny

from tik_kernels.evaluator import core, evaluate, protocol, sandbox, spares

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
    assert ph["probes_candidate_compiled"] == 0  # the CPU interpreter compiles nothing
    # the root's probes (run for the checks) are broken down the same way
    assert "probes_root_child_compute" in ph or "probes_root" not in ph


def test_what_the_child_says_of_its_time_is_kept_only_when_it_is_a_number_of_seconds():
    told = {"compute": 1.5, "send": -1, "graph": float("nan"), "inputs": "fast", "evil": 3.0, "import": True,
            "start": 2, "compiled": 3}
    ph = core.probe_phases({"start": 0.1, "inputs": 0.2, "wait": 5.0, "read": 0.3},
                           {"child": told, "in_bytes": 2_000_000, "out_bytes": 0}, "p")
    assert {k: v for k, v in ph.items() if k.startswith("p_child_")} == {"p_child_compute": 1.5, "p_child_start": 2.0}
    assert ph["p_wait_other"] == pytest.approx(1.5) and ph["p_in_mb"] == 2.0 and ph["p_read"] == 0.3
    assert ph["p_compiled"] == 3  # a count, outside the seconds the wait is split into
    assert "p_compiled" not in core.probe_phases({}, {"child": {"compiled": 2.5}}, "p")
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
@pytest.mark.gpu_timing  # timed evaluations: beside part 1's parallel workers the integrity check (rightly) fails them
def test_on_the_gpu_a_spare_has_warmed_triton_before_its_candidate_arrives(monkeypatch):
    """A pre-started CUDA child has paid Triton's once-per-process costs (`child.warm_triton`): the candidate taken
    by it finds Triton's version key computed already."""
    monkeypatch.setenv(spares.PRESTART_ENV, "1")
    pool = spares.Spares()
    monkeypatch.setattr(spares, "SPARES", pool)  # spawn.PhasedChild reads it there
    try:
        first = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cuda", time_it=True, timeout=120)
        assert first.verified, first.failure
        rep = evaluate(tiny(), FIX / "triton_warm.py", root_path=ROOT, device="cuda", time_it=True, timeout=120)
        assert "warm:1" in (rep.failure or ""), rep.failure
    finally:
        pool.close()


# ----------------------------------------------------------------------------- outputs through a sealed memfd


def _server(tmp_path):
    srv = protocol.listen_shared(tmp_path)
    assert srv is not None
    return srv, str(tmp_path / "reply.sock")


def _hand_over(path: str, fd: int | None, tag: bytes = protocol.SHARED_TAG, extra: int | None = None) -> None:
    """What a child sends, by hand: `fd` (and `extra`) over a connection to `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socket.send_fds(s, [tag], [f for f in (fd, extra) if f is not None])
    s.close()


def _memfd(data: bytes, seals: int) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_outputs_handed_over_sealed_are_mapped_and_read_exactly(tmp_path):
    srv, path = _server(tmp_path)
    x, y = torch.randn(3, 5).to(torch.bfloat16), torch.arange(7)
    shared = protocol.SharedOutputs.open(path)
    refs = [shared.writer.ref(x), shared.writer.ref(y)]
    entries = shared.send()
    data = protocol.receive_shared(srv)
    got = protocol.tensors_from(data, entries)
    assert refs == [0, 1] and torch.equal(got[0], x) and torch.equal(got[1], y)
    # nothing to send on a second read: one connection, one memfd
    with pytest.raises(protocol.ProtocolError, match="no outputs"):
        protocol.receive_shared(srv)


@pytest.mark.parametrize(("seals", "words"), [
    (0, "not sealed"),
    (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, "not sealed"),  # still writable
    (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW, "not sealed"),  # could shrink under the parent's mapping
])
def test_outputs_the_child_could_still_change_are_refused(tmp_path, seals, words):
    srv, path = _server(tmp_path)
    fd = _memfd(b"\0" * 64, seals)
    _hand_over(path, fd)
    with pytest.raises(protocol.ProtocolError, match=words):
        protocol.receive_shared(srv)
    os.close(fd)


def test_outputs_not_in_one_tagged_memfd_are_refused(tmp_path):
    srv, path = _server(tmp_path)
    with pytest.raises(protocol.ProtocolError, match="no outputs"):
        protocol.receive_shared(srv)
    f = tmp_path / "plain.bin"
    f.write_bytes(b"\0" * 64)
    fd = os.open(f, os.O_RDONLY)
    _hand_over(path, fd)
    with pytest.raises(protocol.ProtocolError, match="not in shared memory"):
        protocol.receive_shared(srv)
    sealed = _memfd(b"\0" * 64, protocol.SEALS)
    _hand_over(path, sealed, extra=fd)
    with pytest.raises(protocol.ProtocolError, match="one memfd"):
        protocol.receive_shared(srv)
    _hand_over(path, sealed, tag=b"tik-inputs!")
    with pytest.raises(protocol.ProtocolError, match="one memfd"):
        protocol.receive_shared(srv)
    os.close(fd)
    os.close(sealed)


def test_a_manifest_beyond_the_handed_over_bytes_is_refused(tmp_path):
    srv, path = _server(tmp_path)
    shared = protocol.SharedOutputs.open(path)
    shared.writer.ref(torch.ones(4))
    entries = shared.send()
    data = protocol.receive_shared(srv)
    entries[0] = {**entries[0], "shape": [8], "nbytes": 32}  # more than was sent
    with pytest.raises(protocol.ProtocolError, match="outside the data file"):
        protocol.tensors_from(data, entries)


def test_an_evaluation_takes_its_outputs_through_the_memfd_and_an_unsealed_one_fails(monkeypatch):
    taken = []
    receive = core.receive_shared
    monkeypatch.setattr(core, "receive_shared", lambda srv: taken.append(1) or receive(srv))
    rep = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", time_it=True, timeout=60)
    assert rep.verified and taken, rep.failure
    rep = evaluate(tiny(), FIX / "unsealed.py", root_path=ROOT, device="cpu", time_it=True, timeout=60)
    assert not rep.verified and rep.failure == "protocol error: the child's outputs are not sealed", rep.failure
