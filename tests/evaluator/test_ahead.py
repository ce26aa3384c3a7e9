"""Compiling a child's kernels ahead (`ahead`): the recorder sees each specialization once and leaves Triton as it
found it; the forked workers compile side by side into the cache the real pass reads, and one that fails or hangs
costs nothing but its own kernels (the real pass compiles them). The CPU tests drive the machinery through a
stand-in for Triton's JITFunction (the interpreter compiles nothing); the GPU test uses Triton itself."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tik_kernels.evaluator import ahead


class FakeBackend:
    """A stand-in for Triton's compiler backend: `add_stages` is where Triton's `compile` starts compiling."""

    def add_stages(self, *args):
        pass


class FakeJIT:
    """A stand-in for triton.runtime.jit.JITFunction: `_do_compile(key, signature, device, ...)` returns at once for a
    key in `cached` (Triton's cache hit, noted in `loaded` with the pid that loaded it); otherwise it starts compiling
    (the backend's `add_stages`) and writes a file named after its key into `out` (the "cache"), or sleeps or raises
    when the key says so; `launch` is `run`'s cache miss."""

    out: Path
    cached: set = set()
    loaded: list = []

    def __init__(self, name: str):
        self.name = name

    def _do_compile(self, key, signature, device, *rest, **kw):
        if key == "odd":
            raise OSError("an unreadable cache entry")
        if (self.name, key) in self.cached:
            self.loaded.append((self.name, key, os.getpid()))
            return "kernel"
        FakeBackend().add_stages({}, None, "ttir")
        if key == "hang":
            time.sleep(600)
        if key in ("slow", "soon"):
            time.sleep(0.6 if key == "slow" else 0.2)
        if key == "boom":
            raise RuntimeError("bad kernel")
        (self.out / f"{self.name}-{key}-{os.getpid()}").write_text("compiled")
        return "kernel"

    def launch(self, key):
        return self._do_compile(key, "sig", "dev")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    FakeJIT.out = tmp_path
    monkeypatch.setattr(FakeJIT, "cached", set())
    monkeypatch.setattr(FakeJIT, "loaded", [])
    monkeypatch.setattr(ahead, "_jit_function", lambda: FakeJIT)
    monkeypatch.setattr(ahead, "_backend_class", lambda: FakeBackend)
    return tmp_path


def test_the_recorder_sees_each_specialization_once_compiles_nothing_and_restores_triton(fake):
    a, b = FakeJIT("a"), FakeJIT("b")
    original = FakeJIT._do_compile
    launched = []

    def probe1():
        launched.append(a.launch("k1"))
        launched.append(b.launch("k1"))
        a.launch("k1")

    def probe2():
        a.launch("k2")
        raise ValueError("host code on garbage outputs")  # ends this probe's recording, not the others'

    def probe3():
        a.launch("k1")
        b.launch("k3")

    asked = ahead.record([probe1, probe2, probe3])
    assert [(fn.name, args[0]) for fn, args, _ in asked] == [("a", "k1"), ("b", "k1"), ("a", "k2"), ("b", "k3")]
    assert launched == [None, None]  # a recorded compile is "no kernel": nothing is launched
    assert not list(fake.iterdir())  # and nothing compiled
    assert FakeJIT._do_compile is original


def test_the_recorder_restores_triton_when_a_call_escapes(fake):
    original = FakeJIT._do_compile

    def escapes():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ahead.record([escapes])
    assert FakeJIT._do_compile is original


def test_workers_compile_every_recorded_kernel_side_by_side(fake):
    fns = [FakeJIT(f"f{i}") for i in range(6)]
    asked = ahead.record([lambda fn=fn: fn.launch("k") for fn in fns])
    out = ahead.compile_recorded(asked, workers=3)
    assert out.pop("compile_s") > 0 and out == {"kernels": 6, "cached": 0, "workers": 3, "failed": 0}
    made = sorted(p.name for p in fake.iterdir())
    assert [m.rsplit("-", 1)[0] for m in made] == [f"f{i}-k" for i in range(6)]
    pids = {m.rsplit("-", 1)[1] for m in made}
    assert len(pids) == 3 and str(os.getpid()) not in pids  # three forked workers, none of it in this process


def test_a_failing_or_hanging_worker_costs_only_its_own_kernels(fake):
    fns = [FakeJIT("ok1"), FakeJIT("bad"), FakeJIT("stuck"), FakeJIT("ok2")]
    keys = ["k", "boom", "hang", "k"]
    asked = ahead.record([lambda fn=fn, k=k: fn.launch(k) for fn, k in zip(fns, keys, strict=True)])
    t0 = time.monotonic()
    out = ahead.compile_recorded(asked, workers=4, timeout_s=2.0)
    assert time.monotonic() - t0 < 10 and 2.0 <= out.pop("compile_s") < 10
    assert out == {"kernels": 4, "cached": 0, "workers": 4, "failed": 2}
    assert sorted(p.name.rsplit("-", 1)[0] for p in fake.iterdir()) == ["ok1-k", "ok2-k"]


def test_kernels_the_cache_holds_are_loaded_here_and_only_the_rest_is_forked(fake):
    """A tuner candidate asks mostly for the root's kernels, already in its cache: those are loaded in this process
    (into the function's in-memory cache, where the first launch finds them), and workers are forked only for the
    kernels that must be compiled. A lookup that fails for another reason is left to a worker too; the backend's
    compile step is Triton's own again afterwards."""
    fns = [FakeJIT(f"f{i}") for i in range(5)]
    FakeJIT.cached.update({("f0", "k"), ("f2", "k"), ("f3", "k")})
    keys = ["k", "k", "k", "k", "odd"]
    asked = ahead.record([lambda fn=fn, k=k: fn.launch(k) for fn, k in zip(fns, keys, strict=True)])
    original = FakeBackend.add_stages
    out = ahead.compile_recorded(asked, workers=8)
    assert FakeBackend.add_stages is original
    assert out.pop("compile_s") > 0 and out == {"kernels": 5, "cached": 3, "workers": 2, "failed": 1}
    assert sorted(FakeJIT.loaded) == [("f0", "k", os.getpid()), ("f2", "k", os.getpid()), ("f3", "k", os.getpid())]
    made = sorted(p.name for p in fake.iterdir())
    assert [m.rsplit("-", 1)[0] for m in made] == ["f1-k"] and str(os.getpid()) not in made[0]


def test_with_everything_in_the_cache_no_worker_is_forked(fake):
    fns = [FakeJIT(f"f{i}") for i in range(3)]
    FakeJIT.cached.update({(f"f{i}", "k") for i in range(3)})
    out = ahead.compile_recorded(ahead.record([lambda fn=fn: fn.launch("k") for fn in fns]))
    assert out.pop("compile_s") >= 0 and out == {"kernels": 3, "cached": 3, "workers": 0, "failed": 0}
    assert len(FakeJIT.loaded) == 3 and not list(fake.iterdir())


def test_a_lookup_that_compiles_sends_the_rest_to_the_workers(fake, monkeypatch):
    """Where a Triton's compile would not reach the backend's `add_stages` on a miss, a lookup compiles in this
    process: once one takes longer than LOOKUP_LIMIT_S, the kernels after it go to the workers."""
    monkeypatch.setattr(ahead, "LOOKUP_LIMIT_S", 0.2)
    monkeypatch.setattr(FakeBackend, "add_stages", lambda self, *a: None)
    monkeypatch.setattr(ahead, "_backend_class", lambda: type("Deaf", (), {"add_stages": lambda self, *a: None}))
    slow = FakeJIT("slow")
    real = FakeJIT._do_compile

    def compiles_slowly(self, key, *rest, **kw):
        if self.name == "slow":
            time.sleep(0.3)
        return real(self, key, *rest, **kw)

    monkeypatch.setattr(FakeJIT, "_do_compile", compiles_slowly)
    fns = [slow, FakeJIT("a"), FakeJIT("b")]
    asked = ahead.record([lambda fn=fn: fn.launch("k") for fn in fns])
    out = ahead.compile_recorded(asked, workers=4)
    assert out["cached"] == 1 and out["workers"] == 2 and out["failed"] == 0, out
    made = {p.name.rsplit("-", 1)[0]: p.name.rsplit("-", 1)[1] for p in fake.iterdir()}
    assert made["slow-k"] == str(os.getpid())  # compiled here, by the lookup
    assert made["a-k"] != str(os.getpid()) and made["b-k"] != str(os.getpid())


def test_each_call_knows_the_specializations_it_asked_for(fake):
    a, b = FakeJIT("a"), FakeJIT("b")
    asked, per_call = ahead.record_calls([lambda: (a.launch("k1"), b.launch("k1"), a.launch("k1")),
                                          lambda: (a.launch("k2"), a.launch("k1")), lambda: None])
    assert [(fn.name, args[0]) for fn, args, _ in asked] == [("a", "k1"), ("b", "k1"), ("a", "k2")]
    assert per_call == [[0, 1], [2, 0], []]


def test_probes_run_while_the_workers_compile_those_whose_kernels_are_there_first(fake):
    """`Background`: the workers are forked and it returns at once; a call whose kernels the cache held (or that
    needs none) is ready now, one waiting on a worker is not, and is put last; `wait` returns once its worker has
    ended, `finish` reports what `compile_recorded` reports plus the seconds waited."""
    fast, slow, held = FakeJIT("fast"), FakeJIT("slow"), FakeJIT("held")
    FakeJIT.cached.add(("held", "k"))
    calls = [lambda: slow.launch("slow"), lambda: held.launch("k"), lambda: fast.launch("soon"), lambda: None]
    t0 = time.monotonic()
    bg, per_call, _ = ahead.start_ahead(calls, workers=2)
    assert time.monotonic() - t0 < 0.5  # forked, not waited for
    order = bg.order(per_call)
    assert order == [1, 3, 0, 2], order  # held and kernel-less first, then those compiling, in their order
    bg.wait(per_call[2])
    assert bg.ready(per_call[2]) and (fake / f"fast-soon-{bg.share[per_call[2][0]]}").exists()
    bg.wait(per_call[0])
    assert bg.ready(per_call[0]) and time.monotonic() - t0 >= 0.6
    out = bg.finish()
    assert out["wait_s"] > 0 and out["kernels"] == 3 and out["cached"] == 1 and out["workers"] == 2
    assert out["failed"] == 0 and not bg.left
    assert sorted(p.name.rsplit("-", 1)[0] for p in fake.iterdir()) == ["fast-soon", "slow-slow"]


def test_a_worker_killed_at_the_deadline_does_not_hold_a_probe_for_ever(fake):
    stuck = FakeJIT("stuck")
    bg, per_call, _ = ahead.start_ahead([lambda: stuck.launch("hang")], workers=1, timeout_s=0.5)
    t0 = time.monotonic()
    bg.wait(per_call[0])
    assert time.monotonic() - t0 < 5 and bg.ready(per_call[0])
    assert bg.finish()["failed"] == 1


def test_without_a_backend_to_ask_every_kernel_goes_to_a_worker(fake, monkeypatch):
    monkeypatch.setattr(ahead, "_backend_class", lambda: None)
    FakeJIT.cached.add(("f0", "k"))
    out = ahead.compile_recorded(ahead.record([lambda: FakeJIT("f0").launch("k")]))
    assert out["cached"] == 0 and out["workers"] == 1
    assert FakeJIT.loaded == []  # loaded by the worker, in its own process


def test_without_triton_jit_or_on_the_interpreter_there_is_nothing_to_do(monkeypatch):
    monkeypatch.setattr(ahead, "_jit_function", lambda: None)
    calls = []
    out = ahead.compile_ahead([lambda: calls.append(1)])
    assert out["kernels"] == 0 and out["workers"] == 0 and calls == []


@pytest.mark.gpu
def test_on_the_gpu_a_kernel_compiled_ahead_is_loaded_not_compiled_by_its_first_launch(tmp_path, monkeypatch):
    """Real Triton: a fresh cache, one kernel at two specializations recorded and compiled by forked workers; the
    launches that follow add nothing to the cache and give the right values."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    import torch
    import triton
    import triton.language as tl

    src = tmp_path / "kern.py"
    src.write_text(
        "import triton\nimport triton.language as tl\n"
        "@triton.jit\n"
        "def add_one(x, y, n, BLOCK: tl.constexpr):\n"
        "    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(y + i, tl.load(x + i, mask=i < n) + 1.0, mask=i < n)\n")
    from tik_kernels.contract import load_module

    mod = load_module(src, "tik_ahead_kern")
    x = torch.arange(1000, device="cuda", dtype=torch.float32)

    def run(block):
        y = torch.empty_like(x)
        mod.add_one[(triton.cdiv(1000, block),)](x, y, 1000, BLOCK=block)
        return y

    def entries():
        d = tmp_path / "cache"
        return sum(1 for e in os.scandir(d) if not e.name.startswith("tmp.")) if d.is_dir() else 0

    out = ahead.compile_ahead([lambda: run(128), lambda: run(256), lambda: run(128)])
    assert out["kernels"] == 2 and out["workers"] == 2 and out["failed"] == 0, out
    made = entries()
    assert made >= 2
    for block in (128, 256):
        assert torch.equal(run(block), x + 1.0)
    assert entries() == made  # loaded from the cache, nothing compiled again
    # a fresh import of the same source (its in-memory caches empty): the two specializations the cache holds are
    # loaded in this process, only the new one is compiled by a worker
    mod = load_module(src, "tik_ahead_kern_again")
    out = ahead.compile_ahead([lambda: run(128), lambda: run(256), lambda: run(512)])
    assert out["kernels"] == 3 and out["cached"] == 2 and out["workers"] == 1 and out["failed"] == 0, out
    grown = entries()
    assert grown > made
    for block in (128, 256, 512):
        assert torch.equal(run(block), x + 1.0)
    assert entries() == grown
    # in the background (the probes child's way): the calls whose kernels the cache holds run first while a worker
    # compiles the new one; the call that needs it waits for that worker, and its launch compiles nothing again
    mod = load_module(src, "tik_ahead_kern_background")
    calls = [lambda: run(1024), lambda: run(128), lambda: run(256)]
    bg, per_call, _ = ahead.start_ahead(calls)
    order = bg.order(per_call)
    assert order[-1] == 0 and sorted(order) == [0, 1, 2], order
    for i in order:
        bg.wait(per_call[i])
        assert torch.equal(calls[i](), x + 1.0)
    out = bg.finish()
    assert out["kernels"] == 3 and out["cached"] == 2 and out["workers"] == 1 and out["failed"] == 0, out
    assert entries() > grown
    settled = entries()
    assert torch.equal(run(1024), x + 1.0) and entries() == settled
    assert tl is not None
