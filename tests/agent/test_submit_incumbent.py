"""An evaluation is timed against the root and the incumbent; while the incumbent is the root, the root is sent once
(a third contender running the root's code cost every evaluation of the H200's attention search a third more
timing), and once another node is the incumbent both go."""

from concurrent.futures import Future
from types import SimpleNamespace

from tik_tui.agent.evaluate import Evaluations
from tik_tui.agent.state import SearchConfig


class _Ws:
    def __init__(self):
        self.inc = None

    def root(self, op):
        return {"id": 1}

    def incumbent(self, op):
        return self.inc

    def source(self, impl_id):
        return f"# source of #{impl_id}\n"


class _Executor:
    device = "cuda"

    def __init__(self):
        self.jobs = []

    def submit(self, job):
        self.jobs.append(job)
        return Future()


def test_the_root_as_incumbent_is_sent_once_and_a_promoted_incumbent_beside_it():
    ws, ex = _Ws(), _Executor()
    control = SimpleNamespace(emit=lambda *a, **k: None)
    ev = Evaluations(ws, SearchConfig(ops=["op"]), control, ex, decide=lambda p, o: "")
    ev.submit("op", 5)
    ws.inc = {"id": 1}  # the store names the root as the incumbent
    ev.submit("op", 6)
    ws.inc = {"id": 4}
    ev.submit("op", 7)
    first, second, third = ex.jobs
    for job in (first, second):
        assert job.root_source == "# source of #1\n" and job.incumbent_source is None and job.incumbent_id == 1
    assert third.incumbent_id == 4 and third.incumbent_source == "# source of #4\n"
    assert all(p.incumbent_id == i for p, i in zip(ev.inflight.values(), (1, 1, 4), strict=True))
