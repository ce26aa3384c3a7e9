"""The parts of the evaluator that need no child: the wire format's validation, the decision rules,
and the timing-integrity rules fed with the numbers a side-stream or lazy candidate produces on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from tik_kernels.contract import CheckResult
from tik_kernels.evaluator.measure import close_to, integrity_ok
from tik_kernels.evaluator.protocol import ProtocolError, TensorWriter, decode, encode, read_tensors
from tik_kernels.evaluator.report import EvalReport, decide
from tik_kernels.evaluator.timing import summarize


def test_tensors_round_trip_bit_exact(tmp_path):
    ts = [torch.randn(3, 5).to(torch.bfloat16), torch.tensor([True, False, True]), torch.arange(7, dtype=torch.int64),
          torch.tensor(float("nan")), torch.empty(0, 4), torch.randn(4, 6).t()]
    ts[0][0, 0] = float("nan")
    w = TensorWriter(tmp_path / "t.bin")
    doc = encode((ts[0], {"k": ts[1], "f": 1e-6, "n": None}, [ts[2], torch.float32], ts[3], ts[4], ts[5]), w)
    entries = w.close()
    back = decode(json.loads(json.dumps(doc)), read_tensors(tmp_path / "t.bin", entries))
    assert back[1]["f"] == 1e-6 and back[1]["n"] is None and back[2][1] is torch.float32
    got = [back[0], back[1]["k"], back[2][0], back[3], back[4], back[5]]
    for a, b in zip(got, ts, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.is_contiguous()
        if a.is_floating_point():
            assert torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                               b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32))
        else:
            assert torch.equal(a, b)


def test_a_tensor_referenced_again_crosses_once_and_entries_are_aligned(tmp_path):
    w8 = torch.randn(64, 64).to(torch.bfloat16)
    odd = torch.randn(3, 3).to(torch.bfloat16)  # 18 bytes: the next entry needs padding
    w = TensorWriter(tmp_path / "t.bin")
    doc = encode(((odd, w8), (w8, odd), (torch.arange(3),)), w)
    entries = w.close()
    assert len(entries) == 3 and all(e["offset"] % 64 == 0 for e in entries)
    assert (tmp_path / "t.bin").stat().st_size == entries[-1]["offset"] + entries[-1]["nbytes"] < 2 * 64 * 64 * 2
    back = decode(json.loads(json.dumps(doc)), read_tensors(tmp_path / "t.bin", entries))
    assert torch.equal(back[0][1].view(torch.int16), w8.view(torch.int16))
    assert torch.equal(back[1][1].view(torch.int16), odd.view(torch.int16))
    assert back[2][0].tolist() == [0, 1, 2]


def test_a_writer_that_keeps_nothing_lets_a_written_tensor_go_and_still_sends_a_live_one_once(tmp_path):
    """`keep=False` (the timing child's writer, alive through every cell): a tensor written is not held, so its
    memory goes when its owner lets it go; one still alive and referenced again crosses once; a later tensor that
    reuses a dead one's id is written as itself."""
    import gc
    import weakref

    w = TensorWriter(tmp_path / "t.bin", keep=False)
    live = torch.arange(4, dtype=torch.int32)
    assert w.ref(live) == w.ref(live) == 0
    gone = torch.arange(5, dtype=torch.int32)
    seen = weakref.ref(gone)
    assert w.ref(gone) == 1
    del gone
    gc.collect()
    assert seen() is None and not w.tensors
    # every id the dead tensor could have left is written anew
    later = [torch.full((3,), k, dtype=torch.int32) for k in range(50)]
    idx = [w.ref(t) for t in later]
    assert idx == list(range(2, 52))
    entries = w.close()
    back = read_tensors(tmp_path / "t.bin", entries)
    assert back[0].tolist() == [0, 1, 2, 3] and back[1].tolist() == [0, 1, 2, 3, 4]
    assert [b.tolist() for b in back[2:]] == [[k] * 3 for k in range(50)]


@pytest.mark.parametrize("shared", [False, True])
def test_a_device_tensor_copied_into_mapped_pages_gives_the_bytes_a_write_gives(tmp_path, shared, monkeypatch):
    """A GPU tensor's bytes go straight into the file's (or memfd's) pages through a mapping (`TensorWriter._mapped`);
    here every tensor takes that path: the same file, byte for byte, as the plain writes, across page boundaries
    and at offsets that are no multiple of a page, and no writable mapping is left (the memfd then takes its seals)."""
    import fcntl
    import os

    from tik_kernels.evaluator.protocol import SEALS

    ts = [torch.randn(3, 5).to(torch.bfloat16), torch.tensor([True, False, True]), torch.randn(700, 33)[:, ::2],
          torch.arange(5000, dtype=torch.int64), torch.empty(0, 4), torch.randn(40000).to(torch.bfloat16)]

    def write(mapped: bool) -> bytes:
        if mapped:
            monkeypatch.setattr(TensorWriter, "_put", lambda self, t, start, n: self._mapped(t, start, n))
        fd = os.memfd_create("t", os.MFD_ALLOW_SEALING) if shared else None
        w = TensorWriter(None if shared else tmp_path / f"{mapped}.bin", fd=fd)
        for t in ts:
            w.ref(t)
        entries = w.close()
        monkeypatch.undo()
        if shared:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)  # EBUSY if a writable mapping were left
            data = os.pread(fd, 1 << 22, 0)
            os.close(fd)
        else:
            data = (tmp_path / f"{mapped}.bin").read_bytes()
        assert len(data) == entries[-1]["offset"] + entries[-1]["nbytes"]
        return data

    assert write(True) == write(False)


def test_an_empty_tensor_last_after_an_odd_sized_one_still_reads_back(tmp_path):
    """Its entry's offset is aligned past the bytes written so far: the file must reach it (an empty output of a probe
    with no tokens, the last one sent, was once refused as a byte range outside the data file)."""
    import os

    fd = os.memfd_create("t")
    for w in (TensorWriter(tmp_path / "t.bin"), TensorWriter(None, fd=fd)):
        w.ref(torch.randn(3))
        w.ref(torch.empty(0, 4))
        entries = w.close()
        assert entries[1]["offset"] == 64
        if w.path is None:
            data = tmp_path / "m.bin"
            data.write_bytes(os.pread(fd, 1 << 16, 0))
        else:
            data = w.path
        back = read_tensors(data, entries)
        assert back[1].shape == (0, 4) and back[0].shape == (3,)
    os.close(fd)


def test_a_misaligned_or_overlapping_manifest_still_reads_the_right_bytes(tmp_path):
    """A hostile child may put a float32 at an odd offset, or two entries over the same bytes."""
    raw = b"\0" + torch.tensor([1.5, -2.0], dtype=torch.float32).numpy().tobytes()
    (tmp_path / "o.bin").write_bytes(raw)
    e = {"dtype": "float32", "shape": [2], "offset": 1, "nbytes": 8}
    a, b = read_tensors(tmp_path / "o.bin", [e, e])
    assert a.tolist() == [1.5, -2.0] and b.tolist() == [1.5, -2.0]


def test_same_bits_sees_nan_payloads_and_signed_zeros():
    from tik_kernels.contract import same_bits

    x = torch.tensor([0.0, float("nan"), 1.0])
    assert same_bits(x, x.clone()) and not same_bits(x, torch.tensor([-0.0, float("nan"), 1.0]))
    assert not same_bits(x, x.to(torch.float64)) and not same_bits(x, x[:2])
    assert same_bits(torch.tensor([True, False]), torch.tensor([True, False]))
    assert not same_bits(x.to(torch.bfloat16), (x + 1).to(torch.bfloat16))


def _write(tmp_path, n=8):
    (tmp_path / "o.bin").write_bytes(b"\x01" * n)
    return tmp_path / "o.bin"


@pytest.mark.parametrize("entry,words", [
    ({"dtype": "float32", "shape": [3], "offset": 0, "nbytes": 12}, "byte range"),
    ({"dtype": "float32", "shape": [1], "offset": 0, "nbytes": 8}, "8 bytes for shape"),
    ({"dtype": "object", "shape": [1], "offset": 0, "nbytes": 8}, "not allowed"),
    ({"dtype": "complex64", "shape": [1], "offset": 0, "nbytes": 8}, "not allowed"),
    ({"dtype": "int64", "shape": [-1], "offset": 0, "nbytes": 8}, "bad shape"),
    ({"dtype": "int64", "shape": [1.0], "offset": 0, "nbytes": 8}, "bad shape"),
    ({"dtype": "int64", "shape": [1], "offset": -8, "nbytes": 8}, "byte range"),
    ({"dtype": "int64", "shape": [1], "offset": 0, "nbytes": 8, "pickle": "x"}, "malformed"),
    ({"dtype": "bool", "shape": [8], "offset": 0, "nbytes": 8}, None),
])
def test_hostile_manifests_are_rejected(tmp_path, entry, words):
    path = _write(tmp_path)
    if words is None:
        assert read_tensors(path, [entry])[0].all()
        (tmp_path / "o.bin").write_bytes(b"\x02" * 8)
        words = "bool bytes"
    with pytest.raises(ProtocolError, match=words):
        read_tensors(path, [entry])
    with pytest.raises(ProtocolError):
        read_tensors(path, {"not": "a list"})


def _cells(cand, root, inc=None, limit=0.05):
    return [{"cell": f"c{i}", "coeff": 1.0, "limit": limit, "median_us": c, "root_median_us": r,
             "incumbent_median_us": (inc or root)[i]} for i, (c, r) in enumerate(zip(cand, root, strict=True))]


def _report(cells, passed=True, ci=(0.9, 0.95)):
    return EvalReport(op="x", verified=False, failure=None, checks=[CheckResult("a", "a", passed, "d")], cells=cells,
                      objective_ci=list(ci) if ci is not None else None)


def test_decision_rules():
    rep = _report(_cells([9.0, 10.4], [10.0, 10.0]))
    decide(rep)
    assert rep.verified and rep.admissible and rep.eligible
    assert rep.objective == pytest.approx(19.4) and rep.incumbent_objective == pytest.approx(20.0)
    # the same medians, but a gain within the noise (the interval reaches 1 - MIN_GAIN) or no interval at all
    for ci in ((0.95, 0.995), (0.9, 1.02), None):
        rep = _report(_cells([9.0, 10.4], [10.0, 10.0]), ci=ci)
        decide(rep)
        assert rep.admissible and not rep.eligible
    # one cell more than 5% slower than the root: not admissible, however good the objective
    rep = _report(_cells([5.0, 10.6], [10.0, 10.0]))
    decide(rep)
    assert rep.verified and not rep.admissible and not rep.eligible
    # admissible but not better than the incumbent (a tie is no improvement)
    rep = _report(_cells([10.0, 10.0], [10.0, 10.0]))
    decide(rep)
    assert rep.admissible and not rep.eligible
    rep = _report(_cells([9.0, 9.0], [10.0, 10.0], inc=[8.0, 8.0]))
    decide(rep)
    assert rep.admissible and not rep.eligible
    # a failed check: neither verified nor admissible, and the failure names it
    rep = _report(_cells([1.0, 1.0], [10.0, 10.0]), passed=False)
    decide(rep)
    assert not rep.verified and not rep.admissible and not rep.eligible and rep.failure == "a: d"
    rep = _report([])
    decide(rep)
    assert rep.verified and rep.admissible is None and rep.objective is None


def test_summary_is_median_and_iqr():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0, 100.0])
    assert s["median_us"] == 3.5 and s["samples"] == 6 and 0 < s["spread_us"] < 50


def _timed(cand_ev, cand_wall, prof_c, prof_r=None, root_ev=10.0):
    n = 10
    return {"samples": {"candidate": {"event_us": [cand_ev] * n, "wall_us": [cand_wall] * n},
                        "root": {"event_us": [root_ev] * n, "wall_us": [root_ev + 40] * n}},
            "profile": {"candidate": prof_c, "root": prof_r or {"kernels": 1, "kernel_us": 9.0, "window_us": 10.0,
                                                                 "overlap_spin": 0}}}


CONTROL = {"samples": {"root": {"event_us": [10.0] * 10, "wall_us": [50.0] * 10}}}


def test_integrity_passes_an_honest_profile():
    ok, detail = integrity_ok(_timed(8.0, 48.0, {"kernels": 2, "kernel_us": 7.5, "window_us": 8.0,
                                                  "overlap_spin": 0}), CONTROL)
    assert ok, detail


@pytest.mark.parametrize("prof,wall,words", [
    # side stream: the kernels overlap the harness's spin kernel, events see almost nothing
    ({"kernels": 1, "kernel_us": 9.0, "window_us": 1.5, "overlap_spin": 1}, 48.0, "spin kernel"),
    # side stream that waits for the spin first: more kernel time than the event window holds
    ({"kernels": 1, "kernel_us": 900.0, "window_us": 2.0, "overlap_spin": 0}, 48.0, "escapes"),
    # no device work at all (a cached or CPU result)
    ({"kernels": 0, "kernel_us": 0.0, "window_us": 2.0, "overlap_spin": 0}, 48.0, "no GPU kernel"),
    # honest kernels under the profiler, but the timed samples claim a third of their time
    ({"kernels": 1, "kernel_us": 6.0, "window_us": 6.2, "overlap_spin": 0}, 48.0, "tampered"),
    # profiler blind, but the host waited 2 ms for the device after a 2 us event window
    ({"error": "no profiler"}, 2000.0, "host wall time"),
])
def test_integrity_catches_work_outside_the_window(prof, wall, words):
    ok, detail = integrity_ok(_timed(2.0, wall, prof), CONTROL)
    assert not ok and words in detail, detail


def test_integrity_catches_a_candidate_that_slows_the_root():
    timed = _timed(8.0, 48.0, {"kernels": 1, "kernel_us": 7.0, "window_us": 8.0, "overlap_spin": 0}, root_ev=14.0)
    ok, detail = integrity_ok(timed, CONTROL)
    assert not ok and "slower beside the candidate" in detail


def test_close_to():
    r = torch.randn(64, 16)
    assert close_to([r.clone()], [r], 0.05)[0]
    assert not close_to([torch.zeros_like(r)], [r], 0.05)[0]
    assert not close_to([r.to(torch.bfloat16)], [r], 0.05)[0]
    assert not close_to([torch.full_like(r, float("nan"))], [r], 0.05)[0]
    assert not close_to([r[torch.randperm(64)]], [r], 0.05)[0]
    ids = torch.arange(200)
    assert close_to([ids], [ids], 0.05)[0] and not close_to([ids.flip(0)], [ids], 0.05)[0]
    # large outputs come back as a sample of rows (what the GPU timing harness sends)
    rows = torch.tensor([3, 0, 63])
    assert close_to([(r[rows].clone(), rows)], [r], 0.05)[0]
    assert not close_to([(r[rows] * 0, rows)], [r], 0.05)[0]
    assert not close_to([(r[:1].clone(), torch.tensor([64]))], [r], 0.05)[0]
    assert close_to([(r[:0].clone(), torch.tensor([], dtype=torch.long))], [r], 0.05)[0]


def test_graph_replay_check():
    from tik_kernels.contract import Plan, ProbeResult
    from tik_kernels.evaluator.checks import GRAPH_PREFIX, graph_replay_check

    plan = Plan()
    x = torch.randn(4, 8)
    good = {GRAPH_PREFIX + "p": ProbeResult(outputs=[x], inputs_after=[x.clone()])}
    stale = {GRAPH_PREFIX + "p": ProbeResult(outputs=[x], inputs_after=[x + 1])}
    broken = {GRAPH_PREFIX + "p": ProbeResult(error="RuntimeError: operation not permitted when stream is capturing")}
    assert graph_replay_check(plan, {}, {}) is None
    assert graph_replay_check(plan, good, good).passed
    r = graph_replay_check(plan, stale, good)
    assert not r.passed and "differs from a fresh call" in r.detail
    r = graph_replay_check(plan, broken, good)
    assert not r.passed and "capture/replay failed" in r.detail
    # where the root itself cannot be captured the requirement does not apply
    r = graph_replay_check(plan, broken, broken)
    assert r.passed and "root not capturable" in r.detail
