"""`--record FILE`: the raw HTTP exchanges of a Claude session as JSON lines, and their replay.

One line per exchange: {"t": unix time, "request": {"method", "url", "body"}, "response": {"status",
"headers", "body" | "sse"}}. A streamed response keeps the server's event stream verbatim in "sse"; any other
response keeps its JSON "body". Request headers are never written (the API key travels in one), only the
method, URL and JSON body. The mock-transport tests read the same format (`load`), and `Replay` serves it
to the real SDK client, so a session recorded against the live API can be replayed in a test. A hand-written
fixture may give a response "body" (a complete Message) for a streamed request: `Replay` turns it into the
event stream the server would have sent (`sse`); {"error": "connect"} stands for a server never reached.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

#: response headers worth keeping (the rest are routing noise)
KEEP_HEADERS = ("content-type", "request-id", "retry-after", "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-tokens-remaining")


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")


class Recorder:
    """Appends exchanges to a JSONL file (thread-safe: one line per write)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, request: Any, status: int, headers: Any, raw: bytes) -> None:
        ctype = str(headers.get("content-type", ""))
        resp: dict = {"status": status, "headers": {k: headers[k] for k in KEEP_HEADERS if k in headers}}
        if "text/event-stream" in ctype:
            resp["sse"] = raw.decode("utf-8", "replace")
        else:
            resp["body"] = _json_or_text(raw)
        line = {"t": round(time.time(), 3),
                "request": {"method": request.method, "url": str(request.url), "body": _json_or_text(request.content)},
                "response": resp}
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def recording_client(path: str | Path, inner: Any = None) -> Any:
    """An httpx client for `anthropic.Anthropic(http_client=...)` whose every exchange is recorded; `inner`: the
    transport that really sends (default: the network)."""
    import httpx2
    from anthropic import DefaultHttpxClient

    recorder = Recorder(path)

    class _Tee(httpx2.SyncByteStream):
        """Passes the response through chunk by chunk (streaming stays live) and records it when closed."""

        def __init__(self, request, response):
            self.request, self.response, self.chunks, self.done = request, response, [], False

        def __iter__(self):
            for chunk in self.response.stream:
                self.chunks.append(chunk)
                yield chunk

        def close(self) -> None:
            if not self.done:
                self.done = True
                recorder.write(self.request, self.response.status_code, self.response.headers, b"".join(self.chunks))
            self.response.close()

    class RecordingTransport(httpx2.BaseTransport):
        def __init__(self):
            self.inner = inner if inner is not None else httpx2.HTTPTransport()

        def handle_request(self, request):
            response = self.inner.handle_request(request)
            return httpx2.Response(response.status_code, headers=response.headers, stream=_Tee(request, response),
                                   extensions=response.extensions)

        def close(self) -> None:
            self.inner.close()

    return DefaultHttpxClient(transport=RecordingTransport())


def load(path: str | Path) -> list[dict]:
    """The exchanges of a recording (or a fixture in the same format)."""
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def sse(message: dict) -> str:
    """A complete Message as the server streams it (message_start ... message_stop)."""
    out = []

    def ev(kind: str, data: dict) -> None:
        out.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n")

    start = dict(message, content=[], stop_reason=None, usage=dict(message["usage"], output_tokens=1))
    ev("message_start", {"type": "message_start", "message": start})
    for i, b in enumerate(message["content"]):
        if b["type"] == "text":
            ev("content_block_start", {"type": "content_block_start", "index": i,
                                       "content_block": {"type": "text", "text": ""}})
            ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                       "delta": {"type": "text_delta", "text": b["text"]}})
        elif b["type"] == "thinking":
            ev("content_block_start", {"type": "content_block_start", "index": i,
                                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
            ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                       "delta": {"type": "thinking_delta", "thinking": b["thinking"]}})
            ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                       "delta": {"type": "signature_delta", "signature": b.get("signature", "")}})
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
    return "".join(out)


class Replay:
    """Serves recorded responses, in order, to the real SDK client, and keeps the requests it was sent."""

    def __init__(self, exchanges: list[dict]):
        self.responses = [x["response"] if "response" in x else x for x in exchanges]
        self.requests: list[dict] = []
        self.headers: list[dict] = []

    def handler(self, request: Any) -> Any:
        import httpx2

        body = json.loads(request.content) if request.content else {}
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if not self.responses:
            return httpx2.Response(500, json={"type": "error", "error": {"type": "api_error",
                                                                          "message": "no more recorded responses"}})
        r = self.responses.pop(0)
        if r.get("error") == "connect":
            raise httpx2.ConnectError("recorded: connection refused", request=request)
        headers = {"request-id": "req_replay", **r.get("headers", {})}
        if r["status"] == 200 and body.get("stream"):
            text = r["sse"] if "sse" in r else sse(r["body"])
            return httpx2.Response(200, content=text.encode(), headers={**headers, "content-type": "text/event-stream"})
        return httpx2.Response(r["status"], json=r["body"], headers=headers)

    def client(self, api_key: str = "sk-test") -> Any:
        import httpx2
        from anthropic import Anthropic, DefaultHttpxClient

        return Anthropic(api_key=api_key, max_retries=0,
                         http_client=DefaultHttpxClient(transport=httpx2.MockTransport(self.handler)))
