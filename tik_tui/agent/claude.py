"""The `claude` proposer: the Anthropic Messages API with tool use.

The model reads the evidence through tools (an implementation's source, its measurements,
the attempts made from it and why they failed, the frontier, open opportunities), may
record an opportunity, and ends by calling `submit_implementation` with a complete file.
The tools and the system prompt (rules + the operator's contract + the root source) are a
stable prefix marked for prompt caching; the parent and its evidence follow in the first
user turn. Responses are streamed, and the partial source is emitted as events while the
model writes it. Every call's usage (input, output, cache read/write tokens) and its cost
are summed into the proposal.

Failures: a missing or rejected key, an unknown model or a refused request stop the search
(`ProposerFatal`, one line); rate limits, overload (529) and connection errors are retried
with backoff; a malformed submission is a failed proposal and the search goes on.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any

from tik_tui.agent.base import BudgetExhausted, Proposal, ProposalContext, ProposalFailed, ProposerFatal, check_source

DEFAULT_MODEL = "claude-sonnet-4-5"

#: US$ per million tokens: (input, output, cache write, cache read). Unknown models use Sonnet's rates.
PRICES: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-5": (5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": (15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": (3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4": (3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": (1.0, 5.0, 1.25, 0.10),
}

#: partial source is emitted each time it grows by this many characters
STREAM_EMIT_CHARS = 800


def price(model: str) -> tuple[float, float, float, float]:
    for name in sorted(PRICES, key=len, reverse=True):
        if model.startswith(name):
            return PRICES[name]
    return PRICES[DEFAULT_MODEL]


def cost_usd(model: str, input_tokens: int, output_tokens: int, cache_write: int, cache_read: int) -> float:
    p_in, p_out, p_cw, p_cr = price(model)
    return (input_tokens * p_in + output_tokens * p_out + cache_write * p_cw + cache_read * p_cr) / 1e6


TOOLS: list[dict] = [
    {"name": "read_implementation",
     "description": "Source, status, proposer and rationale of one implementation of this operator, by id.",
     "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
    {"name": "read_measurements",
     "description": "Per workload cell: median latency (us), spread, ratio to the root and to stock PyTorch.",
     "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
    {"name": "read_attempts",
     "description": "Earlier derivations from a parent, failed and rejected ones with which check failed and by "
                    "how much.",
     "input_schema": {"type": "object", "properties": {"parent": {"type": "integer"}}, "required": ["parent"]}},
    {"name": "list_frontier",
     "description": "Verified implementations of this operator, best first, with their objective vs the root.",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "read_opportunities",
     "description": "Recorded optimization opportunities: mechanism, target cells, evidence, status.",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "record_opportunity",
     "description": "Record an optimization opportunity for later attempts (a mechanism, the cells it targets, "
                    "the evidence for it).",
     "input_schema": {"type": "object", "properties": {
         "mechanism": {"type": "string"},
         "workloads": {"type": "array", "items": {"type": "string"}},
         "evidence": {"type": "string"}}, "required": ["mechanism"]}},
    {"name": "submit_implementation",
     "description": "Submit ONE complete new implementation file (the whole module, not a diff). Ends the turn.",
     "input_schema": {"type": "object", "properties": {
         "source": {"type": "string", "description": "the complete Python module"},
         "rationale": {"type": "string"},
         "mechanism": {"type": "string", "description": "the optimization mechanism, in a few words"},
         "expected_effect": {"type": "string", "description": "which cells should get faster, and by how much"},
         "numerical_risks": {"type": "string", "description": "what could change bits or accuracy"},
         "merged_from": {"type": "array", "items": {"type": "integer"},
                         "description": "for a merge: the other verified implementation(s) combined"}},
         "required": ["source", "rationale", "mechanism", "expected_effect", "numerical_risks"]}},
]

RULES = """You optimize one GPU operator of TIK, a library of bitwise batch-invariant Triton kernels for RL
post-training. A trusted evaluator checks every candidate against the operator's contract in a separate
process, then times it on every workload cell, interleaved with the incumbent.

A candidate is a complete Python module that defines the operator's entry point(s). It may import only torch,
triton and `tik_kernels._runtime` (for INTERPRET). It may declare TUNABLES (name -> allowed values) and a literal
CONFIG dict. On the CPU interpreter (INTERPRET true) upcast bf16 to fp32 right after tl.load and before tl.dot.

The contract is not negotiable: a token's result must have the same bits whatever the batch size, order or
packing; reruns must agree; inputs must stay unchanged; accuracy against float64 within the stated tolerance;
gradients too where the op is used in training. Never make the reduction order depend on the number of tokens
or their position (no split-K / split-KV chosen from T). Keys in frozen_tunables must not change.

A candidate is admissible when no workload cell is slower than the root by more than its limit, and eligible
when admissible and its weighted objective beats the incumbent's. Failed attempts are kept as evidence: read
them and do not repeat a mistake. Work from the evidence, then call submit_implementation exactly once."""


def _one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s[:limit]


def _api_message(e: Exception) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return _one_line(f"{err.get('type', '')}: {err['message']}")
    return _one_line(getattr(e, "message", None) or e)


class ClaudeProposer:
    """`claude`: model from `model=`, $TIK_MODEL or DEFAULT_MODEL; key from `api_key=` or $ANTHROPIC_API_KEY."""

    name = "claude"

    def __init__(self, model: str | None = None, api_key: str | None = None, client: Any = None,
                 max_tokens: int = 16000, max_turns: int = 10, retries: int = 5, stream: bool = True,
                 sleep: Callable[[float], None] = time.sleep, backoff_s: float = 2.0):
        self.model = model or os.environ.get("TIK_MODEL") or DEFAULT_MODEL
        self._api_key = api_key
        self._client = client
        self.max_tokens = max_tokens
        self.max_turns = max_turns
        self.retries = retries
        self.stream = stream
        self.sleep = sleep
        self.backoff_s = backoff_s

    # ------------------------------------------------------------------ client and calls

    @property
    def client(self) -> Any:
        if self._client is None:
            key = self._api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise ProposerFatal("ANTHROPIC_API_KEY is not set (export it, or use --proposer tuner)")
            import anthropic

            # retries are ours (logged, with the budget in view), not the SDK's
            self._client = anthropic.Anthropic(api_key=key, max_retries=0)
        return self._client

    def _call(self, ctx: ProposalContext, system: list[dict], messages: list[dict]) -> Any:
        import anthropic

        kwargs = dict(model=self.model, max_tokens=self.max_tokens, system=system, tools=TOOLS, messages=messages)
        for attempt in range(self.retries + 1):
            try:
                return self._stream(ctx, kwargs) if self.stream else self.client.messages.create(**kwargs)
            except anthropic.AuthenticationError as e:
                raise ProposerFatal(f"Anthropic API rejected the key (401 {_api_message(e)}): "
                                    "set a valid ANTHROPIC_API_KEY or use --proposer tuner") from None
            except anthropic.PermissionDeniedError as e:
                raise ProposerFatal(f"Anthropic API refused access (403 {_api_message(e)})") from None
            except anthropic.NotFoundError as e:
                raise ProposerFatal(f"model {self.model!r} not found (404 {_api_message(e)})") from None
            except anthropic.BadRequestError as e:
                raise ProposerFatal(f"Anthropic API refused the request (400 {_api_message(e)})") from None
            except (anthropic.RateLimitError, anthropic.InternalServerError, anthropic.APIConnectionError) as e:
                status = getattr(e, "status_code", None) or type(e).__name__
                if attempt == self.retries:
                    raise ProposalFailed(f"Anthropic API unavailable after {self.retries} retries ({status})",
                                         record=False) from None
                delay = self.backoff_s * (2 ** attempt) * (0.5 + random.random())
                retry_after = getattr(getattr(e, "response", None), "headers", {}).get("retry-after")
                if retry_after:
                    try:
                        delay = max(delay, float(retry_after))
                    except ValueError:
                        pass
                if ctx.emit:
                    ctx.emit("llm_retry", {"status": str(status), "attempt": attempt + 1, "delay_s": round(delay, 2)})
                self.sleep(min(delay, 120.0))
        raise AssertionError("unreachable")

    def _stream(self, ctx: ProposalContext, kwargs: dict) -> Any:
        emitted, raw = 0, ""
        with self.client.messages.stream(**kwargs) as stream:
            for event in stream:
                if event.type == "content_block_start":
                    raw = ""
                if event.type != "input_json" or ctx.emit is None:
                    continue
                raw += event.partial_json
                partial = partial_string(raw, "source")
                if partial is not None and len(partial) - emitted >= STREAM_EMIT_CHARS:
                    emitted = len(partial)
                    ctx.emit("proposal_partial", {"parent": ctx.parent.get("id"), "source": partial})
            return stream.get_final_message()

    # ------------------------------------------------------------------ prompt

    def system_prompt(self, ctx: ProposalContext) -> list[dict]:
        contract = json.dumps(ctx.contract, indent=1, default=str)
        root_src = ""
        if ctx.store is not None and ctx.root is not None:
            root_src = ctx.store.source(ctx.root["id"])
        text = (f"{RULES}\n\nOperator: {ctx.op}\nContract:\n{contract}\n\n"
                f"The root implementation (#{(ctx.root or {}).get('id')}), whose bits and speed anchor the "
                f"admissibility limits:\n```python\n{root_src}\n```")
        return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]

    def first_turn(self, ctx: ProposalContext) -> str:
        p = ctx.parent
        parts = [f"Derive a faster implementation of {ctx.op} from #{p.get('id')} ({p.get('status')}, "
                 f"by {p.get('proposer')}).", f"Its source:\n```python\n{ctx.parent_source}\n```"]
        if ctx.measurements:
            parts.append("Its measurements per cell:\n" + json.dumps(_cells(ctx.measurements), default=str))
        if ctx.evidence:
            parts.append("Attempts already made from it (learn from the failures):\n"
                         + json.dumps(_attempts(ctx.attempts), default=str))
            if ctx.opportunities:
                parts.append("Open opportunities:\n" + json.dumps(ctx.opportunities, default=str))
        if ctx.merge_with is not None:
            parts.append(f"Merge it with the verified branch #{ctx.merge_with.get('id')} (list it in "
                         f"merged_from); that source:\n```python\n{ctx.merge_source}\n```")
        if ctx.frontier:
            parts.append("Frontier: " + json.dumps(
                [{k: f.get(k) for k in ("id", "status", "objective", "proposer")} for f in ctx.frontier[:8]],
                default=str))
        return "\n\n".join(parts)

    # ------------------------------------------------------------------ tools

    def _tool(self, ctx: ProposalContext, name: str, args: dict) -> Any:
        st = ctx.store
        if name in {"read_attempts", "read_opportunities", "record_opportunity"} and not ctx.evidence:
            return {"error": "retained evidence is switched off in this search"}
        if st is None:
            return {"error": "no store attached"}
        if name == "read_implementation":
            impl = st.implementation(int(args["id"]))
            if impl is None or impl.get("op") != ctx.op:
                return {"error": f"no implementation #{args['id']} of {ctx.op}"}
            return {**{k: impl.get(k) for k in ("id", "status", "proposer", "rationale", "parents")},
                    "source": st.source(int(args["id"]))}
        if name == "read_measurements":
            return _cells(st.measurements(int(args["id"])))
        if name == "read_attempts":
            return _attempts(st.attempts(ctx.op, parent=int(args["parent"])))
        if name == "list_frontier":
            return [{k: f.get(k) for k in ("id", "status", "objective", "proposer", "rationale")}
                    for f in st.frontier(ctx.op)]
        if name == "read_opportunities":
            return st.opportunities(ctx.op)
        if name == "record_opportunity":
            oid = st.add_opportunity(ctx.op, str(args["mechanism"]), workloads=tuple(args.get("workloads") or ()),
                                     evidence=str(args.get("evidence", "")))
            return {"recorded": oid}
        return {"error": f"unknown tool {name}"}

    # ------------------------------------------------------------------ the conversation

    def propose(self, ctx: ProposalContext) -> Proposal:
        usage = {"model": self.model, "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                 "cache_write_tokens": 0, "cost_usd": 0.0, "calls": 0}
        system = self.system_prompt(ctx)
        messages: list[dict] = [{"role": "user", "content": self.first_turn(ctx)}]
        entries = tuple(ctx.contract.get("entries") or ())
        for _turn in range(self.max_turns):
            spent = usage["input_tokens"] + usage["output_tokens"] + usage["cache_read_tokens"] \
                + usage["cache_write_tokens"]
            if (ctx.tokens_left is not None and spent >= ctx.tokens_left) or \
                    (ctx.dollars_left is not None and usage["cost_usd"] >= ctx.dollars_left):
                err = BudgetExhausted("token or dollar budget reached during a proposal")
                err.usage = usage
                raise err
            msg = self._call(ctx, system, messages)
            _add_usage(usage, self.model, msg.usage)
            blocks = [b.model_dump(exclude_none=True) if hasattr(b, "model_dump") else dict(b) for b in msg.content]
            messages.append({"role": "assistant", "content": [_clean_block(b) for b in blocks]})
            uses = [b for b in blocks if b.get("type") == "tool_use"]
            text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text").strip()
            if not uses:
                raise ProposalFailed(f"model ended its turn ({msg.stop_reason}) without submitting an implementation",
                                     usage=usage, rationale=_one_line(text, 2000))
            results = []
            for use in uses:
                args = use.get("input")
                if use.get("name") == "submit_implementation":
                    return self._submission(ctx, args, usage, entries, text)
                if not isinstance(args, dict):
                    results.append(_result(use["id"], {"error": "tool input must be an object"}, True))
                    continue
                try:
                    out = self._tool(ctx, use.get("name", ""), args)
                    results.append(_result(use["id"], out, isinstance(out, dict) and "error" in out))
                except (KeyError, TypeError, ValueError) as e:
                    results.append(_result(use["id"], {"error": f"bad input: {_one_line(e)}"}, True))
            messages.append({"role": "user", "content": results})
        raise ProposalFailed(f"no submission after {self.max_turns} turns", usage=usage)

    def _submission(self, ctx: ProposalContext, args: Any, usage: dict, entries: tuple, text: str) -> Proposal:
        if not isinstance(args, dict):
            raise ProposalFailed("submit_implementation input is not an object", usage=usage)
        source = args.get("source")
        try:
            check_source(source, entries)
        except ProposalFailed as e:
            e.usage, e.rationale = usage, str(args.get("rationale", ""))[:4000]
            e.modification = {"kind": "rewrite", "mechanism": str(args.get("mechanism", ""))[:200]}
            raise
        merged = [int(m) for m in (args.get("merged_from") or []) if str(m).isdigit()]
        mod = {"kind": "merge" if merged else "rewrite"}
        for k in ("mechanism", "expected_effect", "numerical_risks"):
            mod[k] = str(args.get(k, ""))[:2000]
        if text:
            mod["notes"] = _one_line(text, 2000)
        return Proposal(source=source, rationale=str(args.get("rationale", "")), modification=mod, usage=usage,
                        extra_parents=tuple(m for m in merged if m != ctx.parent.get("id")))


def partial_string(raw: str, key: str) -> str | None:
    """The (possibly unfinished) value of string field `key` in a JSON object still being streamed."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:\s*"', raw)
    if m is None:
        return None
    body, i, out = raw[m.end():], 0, []
    while i < len(body):
        c = body[i]
        if c == '"':
            break
        if c == "\\":
            esc = body[i:i + 6] if body[i + 1:i + 2] == "u" else body[i:i + 2]
            if len(esc) < 2 or (esc[1] == "u" and len(esc) < 6):
                break  # an escape cut in half: wait for the rest
            try:
                out.append(json.loads('"' + esc + '"'))
            except json.JSONDecodeError:
                break
            i += len(esc)
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _add_usage(total: dict, model: str, u: Any) -> None:
    inp = int(getattr(u, "input_tokens", 0) or 0)
    out = int(getattr(u, "output_tokens", 0) or 0)
    cw = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    cr = int(getattr(u, "cache_read_input_tokens", 0) or 0)
    total["input_tokens"] += inp
    total["output_tokens"] += out
    total["cache_write_tokens"] += cw
    total["cache_read_tokens"] += cr
    total["cost_usd"] = round(total["cost_usd"] + cost_usd(model, inp, out, cw, cr), 6)
    total["calls"] += 1


def _clean_block(b: dict) -> dict:
    """An assistant block as the API accepts it back (no SDK-only fields)."""
    if b.get("type") == "text":
        return {"type": "text", "text": b.get("text", "")}
    if b.get("type") == "tool_use":
        return {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b.get("input", {})}
    return {k: v for k, v in b.items() if k not in {"parsed_output", "caller", "toolset_name", "citations"}}


def _result(tool_use_id: str, out: Any, is_error: bool) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": json.dumps(out, default=str)[:60000],
            "is_error": bool(is_error)}


def _cells(cells: list[dict]) -> list[dict]:
    keep = ("cell", "coeff", "limit", "median_us", "spread_us", "ratio_vs_root", "ratio_vs_baseline")
    return [{k: c.get(k) for k in keep if k in c} for c in cells or []]


def _attempts(attempts: list[dict]) -> list[dict]:
    keep = ("id", "status", "status_detail", "proposer", "rationale", "failure", "failed_checks", "objective",
            "incumbent_objective")
    return [{k: a.get(k) for k in keep if a.get(k) not in (None, "", [])} for a in attempts or []]
