"""Agent test fixtures: a workspace holding a toy operator (instant fake evaluator)."""

import pytest
from agent_helpers import fake_eval, make_toy_workspace


@pytest.fixture
def toy_ws(tmp_path):
    ws, root = make_toy_workspace(tmp_path / "ws")
    yield ws
    ws.close()


@pytest.fixture
def evaluate():
    return fake_eval.evaluate
