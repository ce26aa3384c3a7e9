"""Fixtures of the evaluator's tests."""

import pytest

from tik_kernels.evaluator import forkserver, sandbox, servers, spares


@pytest.fixture(params=["launched", "forked"])
def started(request, monkeypatch):
    """A test that takes this runs twice: its candidates' children started by the launcher (a fresh interpreter),
    then forked by the fork server (`zygote.py`), each child started for its candidate (no spare). Yields the server
    in the forked run (None in the other), and checks that the children really were forked."""
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    if request.param == "launched":
        monkeypatch.setenv(forkserver.ENV, "0")
        yield None
        return
    monkeypatch.delenv(forkserver.ENV, raising=False)
    mode, why = sandbox.availability()
    if mode is None:
        pytest.skip(f"the kernel refuses the sandbox's namespaces here: {why}")
    servers.SERVERS.ensure(mode, "cpu", "private")
    server = servers.SERVERS.ready(mode, "cpu")
    assert server is not None, servers.SERVERS.stats
    before = server.forked
    yield server
    assert server.forked > before, "no child of this test was forked"
