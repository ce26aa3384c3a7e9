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


def sse(message: dict) -> bytes:
    """A Messages API response as the server streams it (message_start … message_stop)."""
    import json

    out = []

    def ev(kind, data):
        out.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n")

    start = dict(message, content=[], stop_reason=None, usage=dict(message["usage"], output_tokens=1))
    ev("message_start", {"type": "message_start", "message": start})
    for i, b in enumerate(message["content"]):
        if b["type"] == "text":
            ev("content_block_start", {"type": "content_block_start", "index": i,
                                       "content_block": {"type": "text", "text": ""}})
            ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                       "delta": {"type": "text_delta", "text": b["text"]}})
        else:
            ev("content_block_start", {"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}})
            text = json.dumps(b["input"])
            for k in range(0, len(text), 64):
                ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                           "delta": {"type": "input_json_delta", "partial_json": text[k:k + 64]}})
        ev("content_block_stop", {"type": "content_block_stop", "index": i})
    ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                            "stop_sequence": None},
                         "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    ev("message_stop", {"type": "message_stop"})
    return "".join(out).encode()


class MockAPI:
    """Serves recorded HTTP responses to the real SDK client, in order, and keeps the requests."""

    def __init__(self, responses: list[dict]):
        self.responses = list(responses)
        self.requests: list[dict] = []
        self.headers: list[dict] = []

    def handler(self, request):
        import json

        import httpx2

        body = json.loads(request.content)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if not self.responses:
            return httpx2.Response(500, json={"type": "error", "error": {"type": "api_error",
                                                                          "message": "no more recorded responses"}})
        r = self.responses.pop(0)
        if r["status"] == 200 and body.get("stream"):
            return httpx2.Response(200, content=sse(r["body"]), headers={"content-type": "text/event-stream"})
        return httpx2.Response(r["status"], json=r["body"], headers={"request-id": "req_test"})

    def client(self, api_key: str = "sk-test"):
        import httpx2
        from anthropic import Anthropic, DefaultHttpxClient

        return Anthropic(api_key=api_key, max_retries=0,
                         http_client=DefaultHttpxClient(transport=httpx2.MockTransport(self.handler)))


def recorded(name: str) -> list[dict]:
    import json

    return json.loads((FIXTURES / f"{name}.json").read_text())
