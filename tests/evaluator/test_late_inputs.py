"""A probe's inputs written late (`tik_kernels/contract/late.py`): a kernel launched with programmatic dependent launch
that reads its inputs before its dependency wait computes from poison and fails its checks; one that waits, and every
kernel launched without PDL, computes what it always did."""

from __future__ import annotations

import pytest
import torch
from evaluator_fixtures import FIX, tiny

from tik_kernels.contract import Probe, Staged, call_probe, execute_probe
from tik_kernels.contract import late as L

ROOT = FIX / "tiny_root.py"


def test_on_the_cpu_every_input_is_poisoned_then_written_by_the_writers_released_after_the_call(monkeypatch):
    """The plumbing, with a stand-in writer (the real one is a PDL kernel): the call's tensor inputs, positional and
    keyword, arrive poisoned at the writer, which gets them all at once just before the call and is released once the
    call has returned (or raised); pairs left by a failed call are never written into later."""
    events = []

    def writer(pairs):
        assert all((c.view(-1).view(torch.uint8) == L.POISON).all() for _, c in pairs)
        events.append(("write", len(pairs)))

        def release():
            for m, c in pairs:
                c.copy_(m)
            events.append(("release",))

        return release

    monkeypatch.setattr(L, "lateable", lambda master: master.is_contiguous() and master.numel() > 0)
    monkeypatch.setattr(L, "write_late", writer)
    staged = Staged("cpu")
    staged.pending = []  # as where PDL exists (late inputs on)

    class Mod:
        def f(self, x, w, *, b):
            assert events[-1] == ("write", 3)  # written before the call, released after it
            assert torch.isnan(x).all()  # a kernel reading now reads poison (here: the stand-in's until release)
            return x, w, b

        def g(self, x, w, *, b):
            raise RuntimeError("boom")

        def h(self, x, w, *, b):
            return x

    x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
    outs, _ = call_probe(Mod(), Probe("p", "f", (x, w), {"b": b}), "cpu", staged=staged)
    assert events == [("write", 3), ("release",)] and staged.pending == []
    assert all(torch.equal(o, v) for o, v in zip(outs, (x, w, b), strict=True))  # the values, once released
    with pytest.raises(RuntimeError, match="boom"):
        call_probe(Mod(), Probe("p", "g", (x, w), {"b": b}), "cpu", staged=staged)
    assert events[-1] == ("release",) and staged.pending == []  # released even when the call raised
    # a call that fails while its inputs are made leaves no pairs for the next call to write into
    staged.pending.append((torch.zeros(2), torch.zeros(2)))
    call_probe(Mod(), Probe("p", "f", (x, w), {"b": b}), "cpu", staged=staged)
    assert events[-2] == ("write", 3)
    # the dry run (values=False) writes nothing late
    n = len(events)
    call_probe(Mod(), Probe("p", "h", (x, w), {"b": b}), "cpu", staged=staged, values=False)
    assert len(events) == n


def test_on_the_cpu_nothing_is_written_late(monkeypatch):
    monkeypatch.setenv(L.ENV, "1")
    assert Staged("cpu").pending is None  # no PDL: no kernel starts before the one before it ends


def test_late_inputs_are_on_unless_turned_off(monkeypatch):
    """On by default where PDL exists; TIK_LATE_INPUTS=0 turns them off (the GPU is stood in for here)."""
    from tik_kernels import _runtime

    monkeypatch.setattr(_runtime, "pdl_capable", lambda device: True)
    monkeypatch.delenv(L.ENV, raising=False)
    assert L.active("cuda") and L.active("cuda:1") and not L.active("cpu")
    monkeypatch.setenv(L.ENV, "0")
    assert not L.active("cuda")
    monkeypatch.setenv(L.ENV, "1")
    assert L.active("cuda")
    monkeypatch.setattr(_runtime, "pdl_capable", lambda device: False)
    assert not L.active("cuda")  # no PDL: nothing can start early, nothing to write late


@pytest.mark.gpu
def test_on_the_gpu_a_kernel_that_reads_before_its_wait_reads_poison_one_that_waits_does_not(monkeypatch):
    from tik_kernels.contract import load_module

    monkeypatch.setenv(L.ENV, "1")
    early, waits = load_module(FIX / "pdl_reads_early.py", "pdl_early"), load_module(FIX / "pdl_waits.py", "pdl_w")
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4096, 16, generator=gen).to(torch.bfloat16), torch.randn(16, generator=gen).to(torch.bfloat16)
    want = (x.float() * w.float()).to(torch.bfloat16)
    probe = Probe("p", "scale", (x, w), echo_inputs=True)
    for mod in (early, waits):  # inputs written long before: both right
        assert torch.equal(execute_probe(mod, probe, "cuda").outputs[0], want)
    staged = Staged("cuda")
    assert staged.pending == []
    r = execute_probe(waits, probe, "cuda", staged=staged)
    assert torch.equal(r.outputs[0].cpu(), want) and torch.equal(r.inputs_after[0].cpu(), x)
    bad = execute_probe(early, probe, "cuda", staged=staged)
    assert not torch.equal(bad.outputs[0].cpu(), want)
    assert torch.equal(bad.inputs_after[0].cpu(), x)  # its inputs did arrive: it read them too early


@pytest.mark.gpu
def test_on_the_gpu_the_evaluator_fails_a_candidate_that_reads_before_its_wait(monkeypatch):
    from tik_kernels.evaluator import evaluate

    monkeypatch.setenv(L.ENV, "1")
    ok = evaluate(tiny(), FIX / "pdl_waits.py", root_path=ROOT, device="cuda", time_it=False, timeout=120)
    assert ok.verified, ok.failure
    bad = evaluate(tiny(), FIX / "pdl_reads_early.py", root_path=ROOT, device="cuda", time_it=False, timeout=120)
    assert not bad.verified and bad.failure, bad.failure


@pytest.mark.gpu
def test_on_the_gpu_a_writer_copies_every_byte_of_large_and_odd_sized_inputs():
    for n in (1, 7, 8191, 8193, 3 * L.BLOCK * L.PROGRAMS + 5):
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        dst = L.poisoned_like(src)
        L.write_late([(src, dst)])()
        torch.cuda.synchronize()
        assert torch.equal(dst, src), n
