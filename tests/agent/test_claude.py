"""The claude proposer through the real anthropic SDK client against a mock HTTP transport (recorded responses)."""

import json

import pytest
from agent_helpers import MockAPI, recorded

from tik_tui.agent import ProposalContext, ProposalFailed, ProposerFatal, make_proposer
from tik_tui.agent import claude as claude_mod
from tik_tui.worker import run_search

KEY = "sk-test-secret-1234"


def _search(ws, api, evaluate, budget=1, **kw):
    sleeps = []
    opts = {"client": api.client(KEY), "sleep": sleeps.append}
    s = run_search(ws.path, proposer="claude", budget=budget, evaluate=evaluate, proposer_opts=opts, **kw)
    return s, sleeps


def test_multi_turn_tool_use_overload_retry_and_usage(toy_ws, evaluate, monkeypatch):
    monkeypatch.setattr(claude_mod, "STREAM_EMIT_CHARS", 60)
    api = MockAPI(recorded("claude_session"))
    s, sleeps = _search(toy_ws, api, evaluate)
    assert s["state"] == "finished" and s["spent"] == 1
    impl = toy_ws.implementation(s["derivations"][0])
    final = recorded("claude_session")[2]["body"]["content"][0]["input"]
    assert toy_ws.source(impl["id"]) == final["source"]
    assert impl["status"] == "eligible" and impl["parents"] == [toy_ws.root("toy")["id"]]
    assert impl["rationale"] == final["rationale"]
    mod = impl["modification"]
    assert mod["kind"] == "rewrite" and mod["mechanism"] == "larger tile"
    assert mod["expected_effect"] == final["expected_effect"] and mod["numerical_risks"] == final["numerical_risks"]
    # token accounting: two successful calls (the 529 costs nothing)
    u = impl["usage"]
    assert (u["input_tokens"], u["output_tokens"], u["cache_write_tokens"], u["cache_read_tokens"]) == \
        (2100 + 350, 180 + 900, 3400, 3400)
    # the default model (Sonnet 5.5) at its own rates: $2 in, $10 out, $2.50 cache write, $0.10 cache read
    want = (2450 * 2.0 + 1080 * 10.0 + 3400 * 2.50 + 3400 * 0.10) / 1e6
    assert u["cost_usd"] == pytest.approx(want)
    assert s["tokens"] == 2450 + 1080 + 6800 and s["cost_usd"] == pytest.approx(want)
    assert toy_ws.llm_usage_totals()["cost_usd"] == pytest.approx(want)
    # the 529 was retried once after a backoff, with the same request
    assert len(api.requests) == 3 and len(sleeps) == 1
    assert api.requests[1] == api.requests[2]
    req = api.requests[2]
    assert req["stream"] is True and req["model"] == "claude-sonnet-5-5"
    # nothing the model might reject: no sampling parameters, no thinking / effort unless asked for
    assert not {"temperature", "top_p", "top_k", "thinking", "output_config"} & set(req)
    assert req["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert {t["name"] for t in req["tools"]} >= {"read_implementation", "read_measurements", "read_attempts",
                                                 "list_frontier", "record_opportunity", "submit_implementation"}
    # multi-turn: the tool results went back in the next user turn
    results = req["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_01", "toolu_02"]
    assert isinstance(json.loads(results[0]["content"]), list)
    assert [o["mechanism"] for o in toy_ws.opportunities("toy")] == ["larger BLOCK to cut loop trips"]
    # the partial source streamed out as events, growing, each a prefix of the final file
    partial = [e["payload"]["source"] for e in toy_ws.events_since(0, 10000) if e["kind"] == "proposal_partial"]
    assert len(partial) >= 2 and all(final["source"].startswith(p) for p in partial)
    assert [len(p) for p in partial] == sorted(len(p) for p in partial)
    # the key authenticated the calls and went nowhere into the store
    assert KEY in (api.headers[0].get("x-api-key", "") + api.headers[0].get("authorization", ""))
    for f in toy_ws.path.glob("tik.db*"):
        assert KEY.encode() not in f.read_bytes()
    assert KEY not in json.dumps(toy_ws.events_since(0, 10000))


def test_401_stops_the_search_with_one_clear_line(toy_ws, evaluate):
    api = MockAPI(recorded("claude_401"))
    s, _ = _search(toy_ws, api, evaluate, budget=3)
    assert s["state"] == "stopped" and s["spent"] == 0
    assert s["stop_reason"].startswith("error: ") and "401" in s["stop_reason"]
    assert "ANTHROPIC_API_KEY" in s["stop_reason"] and "\n" not in s["stop_reason"]
    st = toy_ws.worker_state()
    assert st["state"] == "stopped" and "401" in st["message"]
    assert len(api.requests) == 1 and len(toy_ws.implementations(op="toy")) == 1


def test_malformed_submission_is_a_failed_derivation_and_the_search_goes_on(toy_ws, evaluate):
    api = MockAPI(recorded("claude_malformed"))
    s, _ = _search(toy_ws, api, evaluate, budget=2)
    assert s["spent"] == 2
    bad, good = (toy_ws.implementation(i) for i in s["derivations"])
    assert bad["status"] == "failed" and "source is missing" in bad["status_detail"]
    assert bad["usage"]["input_tokens"] == 1000 and bad["usage"]["cache_write_tokens"] == 3000
    assert good["status"] == "eligible" and good["rationale"] == "two warps per row"
    # the second attempt saw the first one's failure (retained evidence)
    assert "source is missing" in api.requests[1]["messages"][0]["content"]


def test_token_budget_stops_mid_proposal(toy_ws, evaluate):
    api = MockAPI(recorded("claude_session"))
    s, _ = _search(toy_ws, api, evaluate, budget=5, max_tokens=2000)
    assert s["spent"] == 0 and "budget" in s["stop_reason"]
    assert len(api.requests) == 1
    totals = toy_ws.llm_usage_totals()
    assert totals["input_tokens"] == 2100 and totals["cache_write_tokens"] == 3400
    assert s["tokens"] == 2100 + 180 + 3400


def _ctx(ws):
    root = ws.root("toy")
    return ProposalContext(op="toy", parent=root, parent_source=ws.source(root["id"]),
                           contract=ws.operators()[0]["contract"], root=root, store=ws)


def test_without_streaming_and_without_a_submission(toy_ws):
    api = MockAPI(recorded("claude_session")[2:])
    p = make_proposer("claude", client=api.client(), stream=False).propose(_ctx(toy_ws))
    assert "stream" not in api.requests[0] and p.usage["output_tokens"] == 900
    talk = {"status": 200, "body": {**recorded("claude_session")[2]["body"],
                                    "content": [{"type": "text", "text": "I think BLOCK=64 would help."}],
                                    "stop_reason": "end_turn"}}
    api = MockAPI([talk])
    with pytest.raises(ProposalFailed, match="without submitting"):
        make_proposer("claude", client=api.client()).propose(_ctx(toy_ws))


def test_missing_key_is_fatal(toy_ws, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProposerFatal, match="ANTHROPIC_API_KEY is not set"):
        make_proposer("claude").propose(_ctx(toy_ws))


def test_overload_retries_give_up(toy_ws):
    api = MockAPI([recorded("claude_session")[1]] * 3)
    sleeps = []
    prop = make_proposer("claude", client=api.client(), retries=2, sleep=sleeps.append)
    with pytest.raises(ProposalFailed, match="unavailable after 2 retries") as e:
        prop.propose(_ctx(toy_ws))
    assert e.value.record is False and len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.5
