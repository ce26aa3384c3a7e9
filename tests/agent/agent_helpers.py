"""Shared helpers of the agent tests: a toy operator, its workspace, the fake evaluator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

TOY_SOURCE = '''"""A toy operator for the agent's tests: the identity, with tunables the fake evaluator times."""

TUNABLES = {"BLOCK": (16, 32, 64, 128), "num_warps": (1, 2, 4, 8), "SPLIT": (1, 2)}
CONFIG = {"BLOCK": 32, "num_warps": 4, "SPLIT": 1}


def toy(x):
    # CONFIG never changes the result here; the fake evaluator reads it to make up a latency
    return x
'''

TOY_CONTRACT = {"op": "toy", "entries": ["toy"], "summary": "identity", "frozen_tunables": ["SPLIT"],
                "requirements": [{"name": "batch_invariance"}, {"name": "accuracy"}]}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fake_eval = _load(FIXTURES / "fake_eval.py", "tik_test_fake_eval")


def make_toy_workspace(path: Path):
    from tik_store import Workspace

    ws = Workspace.init(path)
    ws.ensure_operator("toy", "identity", TOY_CONTRACT, "toy-fp")
    root = ws.add_implementation("toy", TOY_SOURCE, proposer="root", rationale="the library's root",
                                 status="verified")
    ws.decide(root, "promote", by="init", reason="root")
    return ws, root


def recorded(name: str) -> list[dict]:
    """The responses of a fixture in `--record`'s JSONL format (`tik_tui.agent.recording`)."""
    from tik_tui.agent.recording import load

    return [x["response"] for x in load(FIXTURES / f"{name}.jsonl")]


def MockAPI(responses: list[dict]):  # noqa: N802 (kept as the tests' name for the replaying transport)
    """Serves recorded responses to the real SDK client, in order, and keeps the requests."""
    from tik_tui.agent.recording import Replay

    return Replay(responses)


def _ctx_for(ws, op: str = "toy"):
    """A proposal context on `op`'s root, as the loop would build it (no device evidence)."""
    from tik_tui.agent import ProposalContext

    root = ws.root(op)
    contract = next(r["contract"] for r in ws.operators() if r["op"] == op)
    return ProposalContext(op=op, parent=root, parent_source=ws.source(root["id"]), contract=contract, root=root,
                           store=ws)
