"""Models, prices, request options, --record, and how the search ends when the proposer keeps failing."""


import pytest
from agent_helpers import MockAPI, _ctx_for, make_toy_workspace, recorded

from tik_tui.agent import ProposerFatal, make_proposer
from tik_tui.agent.pricing import cost_usd, rates, request_options
from tik_tui.agent.recording import Replay, load, recording_client
from tik_tui.cli.main import main as tik
from tik_tui.worker import run_search

KEY = "sk-test-secret-5678"
M = 1_000_000


@pytest.mark.parametrize("model,rates_", [
    ("claude-sonnet-5-5", (2.0, 10.0, 2.50, 0.10)),
    ("claude-sonnet-5", (2.0, 10.0, 2.50, 0.20)),
    ("claude-opus-5-5", (4.0, 20.0, 5.0, 0.20)),
    ("claude-opus-5", (5.0, 25.0, 6.25, 0.50)),
    ("claude-fable-5-2", (8.0, 40.0, 10.0, 0.20)),
    ("claude-haiku-5-5", (0.10, 0.50, 0.125, 0.01)),
    ("claude-sonnet-4-5-20250929", (3.0, 15.0, 3.75, 0.30)),
    ("claude-opus-4-1", (15.0, 75.0, 18.75, 1.50)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_current_model_is_priced_at_its_own_rates(model, rates_):
    # ten thousand of each kind of token cost a hundredth of the sum of the four rates
    assert cost_usd(model, 10_000, 10_000, 10_000, 10_000) == pytest.approx(sum(rates_) / 100)
    assert cost_usd(model, 2000, 300, 0, 0) == pytest.approx((2000 * rates_[0] + 300 * rates_[1]) / M)


def test_unknown_models_are_not_priced_as_a_neighbour():
    for model in ("claude-sonnet-5-7", "claude-nova-1", "claude-sonnet-5-5x", "gpt-9"):
        assert rates(model) is None and cost_usd(model, 100, 100, 0, 0) is None
    # Haiku 5.5 bills a prompt over 100k tokens (input + cache) at its long-prompt rates, output included
    assert cost_usd("claude-haiku-5-5", 60_000, 1000, 0, 50_000) == pytest.approx(
        (60_000 * 0.50 + 1000 * 2.50 + 50_000 * 0.05) / M)


def test_the_default_model_is_one_the_installed_sdk_lists():
    import typing

    from anthropic.types.model import Model

    from tik_tui.agent.claude import DEFAULT_MODEL

    listed = typing.get_args(typing.get_args(Model)[0])
    assert DEFAULT_MODEL in listed and rates(DEFAULT_MODEL) is not None


def test_request_options_send_only_what_the_model_takes():
    assert request_options("claude-sonnet-5") == {}
    assert request_options("claude-sonnet-5-5", "off", "medium") == {
        "thinking": {"type": "between_tools"}, "output_config": {"effort": "medium"}}
    assert request_options("claude-opus-5", "off", "high")["thinking"] == {"type": "disabled"}
    assert request_options("claude-haiku-4-5", "4096") == {"thinking": {"type": "enabled", "budget_tokens": 4096}}
    for model, thinking, effort, why in (
            ("claude-sonnet-5", "8000", None, "rejects a thinking budget"),
            ("claude-opus-5-5", "off", None, "cannot turn thinking off"),
            ("claude-opus-5", "off", "max", "only with --effort"),
            ("claude-haiku-4-5", None, "high", "does not take effort"),
            ("claude-nova-1", "adaptive", None, "no known thinking/effort options")):
        with pytest.raises(ValueError, match=why):
            request_options(model, thinking, effort)
    with pytest.raises(ProposerFatal, match="rejects a thinking budget"):
        make_proposer("claude", model="claude-sonnet-5", thinking="8000")


def _search(ws, responses, evaluate, budget=1, **opts):
    api = MockAPI(responses)
    opts = {"client": api.client(KEY), "sleep": lambda s: None, **opts}
    return run_search(ws.path, proposer="claude", budget=budget, evaluate=evaluate, proposer_opts=opts), api


def test_thinking_and_effort_reach_the_request(toy_ws, evaluate):
    s, api = _search(toy_ws, recorded("claude_session")[2:], evaluate, thinking="off", effort="low")
    assert s["spent"] == 1
    req = api.requests[0]
    assert req["thinking"] == {"type": "between_tools"} and req["output_config"] == {"effort": "low"}
    assert "temperature" not in req


def test_an_unknown_model_costs_unknown_everywhere(toy_ws, evaluate, capsys):
    s, api = _search(toy_ws, recorded("claude_session")[2:], evaluate, model="claude-nova-1")
    assert api.requests[0]["model"] == "claude-nova-1"
    impl = toy_ws.implementation(s["derivations"][0])
    assert impl["usage"]["output_tokens"] == 900 and impl["modification"]["model"] == "claude-nova-1"
    assert s["cost_usd"] is None and toy_ws.worker_state()["cost_usd"] is None
    assert tik(["-w", str(toy_ws.path), "show", str(impl["id"])]) == 0
    assert "cost unknown (claude-nova-1)" in capsys.readouterr().out
    assert tik(["-w", str(toy_ws.path), "status"]) == 0
    assert "LLM spend: unknown over 1 call(s)" in capsys.readouterr().out
    # a priced model's cost shows in dollars
    s, _ = _search(toy_ws, recorded("claude_session")[2:], evaluate, model="claude-opus-5-5")
    assert s["cost_usd"] == pytest.approx((350 * 4.0 + 900 * 20.0 + 3400 * 0.20) / M)


def test_max_cost_refuses_a_model_without_a_price(toy_ws, evaluate, monkeypatch, capsys):
    with pytest.raises(ValueError, match="--max-cost needs a model with a known price"):
        run_search(toy_ws.path, proposer="claude", budget=1, evaluate=evaluate, max_cost_usd=1.0,
                   proposer_opts={"model": "claude-nova-1", "client": object()})
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    rc = tik(["-w", str(toy_ws.path), "search", "--proposer", "claude", "--model", "claude-nova-1",
              "--max-cost", "2"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "--max-cost needs a model with a known price" in err and len(err.splitlines()) == 1
    assert len(toy_ws.implementations(op="toy")) == 1


def test_record_writes_exchanges_a_replay_reproduces(toy_ws, tmp_path):
    import httpx2
    from anthropic import Anthropic

    path = tmp_path / "session.jsonl"
    live = Replay(recorded("claude_session"))
    client = Anthropic(api_key=KEY, max_retries=0,
                       http_client=recording_client(path, inner=httpx2.MockTransport(live.handler)))
    first = make_proposer("claude", client=client, sleep=lambda s: None).propose(_ctx_for(toy_ws))
    lines = load(path)
    # one line per exchange, the 529 included; streamed bodies verbatim; the key nowhere
    assert [x["response"]["status"] for x in lines] == [200, 529, 200]
    assert "event: message_start" in lines[0]["response"]["sse"] and lines[1]["response"]["body"]["error"]
    assert lines[2]["request"]["body"]["messages"][-1]["content"][0]["tool_use_id"] == "toolu_01"
    assert KEY not in path.read_text()
    # replayed on a workspace in the same state, the session is the same, request for request
    ws2, _ = make_toy_workspace(tmp_path / "ws2")
    again = Replay(lines)
    second = make_proposer("claude", client=again.client(), sleep=lambda s: None).propose(_ctx_for(ws2))
    ws2.close()
    assert second.source == first.source and second.usage == first.usage
    assert again.requests == [x["request"]["body"] for x in lines]


def test_an_unreachable_api_stops_the_search_with_its_reason(toy_ws, evaluate):
    s, api = _search(toy_ws, [{"error": "connect"}] * 6, evaluate, budget=5)
    assert s["spent"] == 0 and len(api.requests) == 6
    assert s["stop_reason"].startswith("the proposer failed before any proposal: Anthropic API unreachable")
    assert "\n" not in s["stop_reason"] and toy_ws.worker_state()["message"] == s["stop_reason"]


def test_failed_proposals_in_a_row_stop_the_search(toy_ws, evaluate):
    bad = recorded("claude_malformed")[0]
    s, _ = _search(toy_ws, [bad] * 5, evaluate, budget=10)
    assert s["spent"] == 3 and s["stop_reason"].startswith("3 proposals in a row failed (last: submitted source")
    # one good proposal in between resets the count
    good = recorded("claude_malformed")[1]
    s, _ = _search(toy_ws, [bad, bad, good, bad, bad], evaluate, budget=5)
    assert s["spent"] == 5 and s["stop_reason"].startswith("budget")


def test_401_is_reported_at_once(toy_ws, evaluate):
    s, api = _search(toy_ws, recorded("claude_401") * 3, evaluate, budget=3)
    assert len(api.requests) == 1 and s["spent"] == 0 and "401" in s["stop_reason"]
    assert "rejected the key" in s["stop_reason"]
