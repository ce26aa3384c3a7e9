"""The `claude` proposer: the Anthropic Messages API with tool use.

The model reads the evidence through tools (an implementation's source, its measurements, the attempts made
from it and why they failed, the frontier, open opportunities; on a GPU the compiled kernels' registers,
spills, shared memory, warps and stages, each cell's fraction of the hardware floor, an Nsight Compute profile
of one cell), may time a draft on a few cells in the sandboxed screen, may record an opportunity, and ends
with one of two tools: `edit_implementation` (exact search/replace edits to the parent's source: a few lines
of output for a few changed lines) or `submit_implementation` (a complete file, for rewrites). Either way the
candidate recorded is a complete file. An edit that does not apply goes back to the model as a tool error and
the turn goes on. The tools and the system prompt (rules + the operator's contract + the root source) are a
stable prefix marked for prompt caching; the parent and its evidence follow in the first user turn.
Responses are streamed, and the partial source of a whole-file submission is emitted while the model writes
it. Every call's usage (input, output, cache read/write tokens) and its cost (`tik_tui.agent.pricing`; None
for a model without a price) are summed into the proposal. `record=FILE` writes every HTTP exchange as JSON
lines (`tik_tui.agent.recording`), never the key.

Failures: a missing or rejected key, an unknown model, options the model rejects or a refused request stop
the search (`ProposerFatal`, one line); rate limits, overload (529) and connection errors are retried with
backoff, then fail this proposal without recording it (the loop stops after a few in a row); a malformed
submission is a failed proposal and the search goes on.
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
from tik_tui.agent.edits import EditError, apply_edits, changed_lines
from tik_tui.agent.pricing import cost_usd, request_options

#: the current Sonnet (in the SDK's model list); $TIK_MODEL or --model for another
DEFAULT_MODEL = "claude-sonnet-5-5"

#: partial source is emitted each time it grows by this many characters
STREAM_EMIT_CHARS = 800
NONSTREAM_TIMEOUT_S = 900.0

_DESCRIBE = {
    "rationale": {"type": "string"},
    "mechanism": {"type": "string", "description": "the optimization mechanism, in a few words"},
    "expected_effect": {"type": "string", "description": "which cells should get faster, and by how much"},
    "numerical_risks": {"type": "string", "description": "what could change bits or accuracy"},
    "merged_from": {"type": "array", "items": {"type": "integer"},
                    "description": "for a merge: the other verified implementation(s) combined"},
}
_EDITS = {"type": "array", "description": "applied in order; each `old` must occur exactly once in the source "
                                          "as it stands after the edits before it (whitespace included)",
          "items": {"type": "object", "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["old", "new"]}}


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
    {"name": "read_evidence",
     "description": "GPU evidence for one implementation (a failed one too): per compiled Triton kernel variant its "
                    "registers per thread, spilled registers, shared memory bytes, num_warps, num_stages, constexprs "
                    "and the cells that launch it; per measured cell its GB/s, TFLOP/s and the fraction of the "
                    "hardware floor reached (1.0 = roofline).",
     "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
    {"name": "profile_cell",
     "description": "Nsight Compute metrics (duration, SM / memory / DRAM throughput % of peak, registers, "
                    "occupancy and its limits) of every kernel one call of one workload cell launches. Slow: "
                    "use it for the cell you mean to improve.",
     "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}, "cell": {"type": "string"}},
                      "required": ["id", "cell"]}},
    {"name": "time_draft",
     "description": "Time a draft beside the parent on a few workload cells (sandboxed, no correctness checks) "
                    "before submitting it: give `edits` to the parent's source or a whole `source`. Returns the "
                    "speedup vs the parent per cell (>1 is faster) or the error the draft raised.",
     "input_schema": {"type": "object", "properties": {
         "edits": _EDITS, "source": {"type": "string"},
         "cells": {"type": "array", "items": {"type": "string"}, "description": "cell names (default: a few)"},
         "rounds": {"type": "integer", "description": "interleaved rounds per cell"}}}},
    {"name": "edit_implementation",
     "description": "Submit the parent's source with exact search/replace edits applied (for changes of a few "
                    "lines: far fewer output tokens than a whole file). Ends the turn when every edit applies; "
                    "an edit that does not match exactly once comes back as an error to fix.",
     "input_schema": {"type": "object", "properties": {"edits": _EDITS, **_DESCRIBE},
                      "required": ["edits", "rationale", "mechanism", "expected_effect", "numerical_risks"]}},
    {"name": "submit_implementation",
     "description": "Submit ONE complete new implementation file (the whole module, for a rewrite). Ends the turn.",
     "input_schema": {"type": "object", "properties": {
         "source": {"type": "string", "description": "the complete Python module"}, **_DESCRIBE},
         "required": ["source", "rationale", "mechanism", "expected_effect", "numerical_risks"]}},
]

RULES = """You optimize one GPU operator of TIK, a library of bitwise batch-invariant Triton kernels for RL
post-training. A trusted evaluator checks every candidate against the operator's contract in a separate
process, then times it on every workload cell, interleaved with the incumbent.

A candidate is a complete Python module that defines the operator's entry point(s). It may import only torch,
triton and the tik_kernels modules the root imports: `tik_kernels._runtime` (for INTERPRET), `tik_kernels.ops._common`
(launch helpers), for the lm_head operators `tik_kernels.ops._lmhead` (the logits tile and backward kernels logprob,
sample and entropy share) and the helpers logprob takes from entropy and sample, and for attention
`tik_kernels.ops.attention_gluon` (the Hopper forward in Gluon, which the root launches where its FWD_GLUON allows).
A candidate may call a shared piece or not, but cannot change it: to change one, define its own copy.
It may declare TUNABLES (name -> allowed values) and a literal CONFIG dict. On the CPU interpreter (INTERPRET true)
upcast bf16 to fp32 right after tl.load and before tl.dot.

The contract is not negotiable: a token's result must have the same bits whatever the batch size, order or
packing; reruns must agree; inputs must stay unchanged; accuracy against float64 within the stated tolerance;
gradients too where the op is used in training. Never make the reduction order depend on the number of tokens
or their position (no split-K / split-KV chosen from T). Keys in frozen_tunables must not change.

A candidate is admissible when no workload cell is slower than the root by more than its limit, and eligible
when admissible and its weighted objective beats the incumbent's. Failed attempts are kept as evidence: read
them and do not repeat a mistake. On a GPU, read what the compiler made of the kernels (registers, spills,
shared memory, warps, stages) and how far each cell is from the hardware floor; time_draft estimates a draft's
speed on a few cells before you submit. Work from the evidence, then end with exactly one edit_implementation
(a change of a few lines) or submit_implementation (a rewrite)."""


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
    """`claude`: model from `model=`, $TIK_MODEL or DEFAULT_MODEL; key from `api_key=` or $ANTHROPIC_API_KEY.

    `thinking` ("adaptive", "off" or a token budget) and `effort` are sent only when given, and only where the
    model takes them (`pricing.request_options`; anything else is a ProposerFatal before any call). `record`: a
    JSONL file every HTTP exchange is appended to. max_tokens covers thinking too (adaptive thinking is on by
    default on the 5.x models), so it is well above a whole attention file (~10k tokens)."""

    name = "claude"
    #: the loop builds a DeviceEvidence for it (compile stats, floors, draft timing, profiles)
    wants_device_evidence = True

    def __init__(self, model: str | None = None, api_key: str | None = None, client: Any = None,
                 max_tokens: int = 32000, max_turns: int = 12, retries: int = 5, stream: bool = True,
                 sleep: Callable[[float], None] = time.sleep, backoff_s: float = 2.0, thinking: str | None = None,
                 effort: str | None = None, record: str | None = None):
        self.model = model or os.environ.get("TIK_MODEL") or DEFAULT_MODEL
        try:
            self.options = request_options(self.model, thinking, effort, max_tokens)
        except ValueError as e:
            raise ProposerFatal(str(e)) from None
        self.record = record
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

            extra = {}
            if self.record:
                from tik_tui.agent.recording import recording_client

                extra["http_client"] = recording_client(self.record)
            # retries are ours (logged, with the budget in view), not the SDK's
            self._client = anthropic.Anthropic(api_key=key, max_retries=0, **extra)
        return self._client

    def _call(self, ctx: ProposalContext, system: list[dict], messages: list[dict]) -> Any:
        import anthropic

        kwargs = dict(model=self.model, max_tokens=self.max_tokens, system=system, tools=TOOLS, messages=messages,
                      **self.options)
        for attempt in range(self.retries + 1):
            try:
                if self.stream:
                    return self._stream(ctx, kwargs)
                # unstreamed, a long thinking turn may pass the SDK's 10-minute guard: the timeout is ours
                return self.client.messages.create(**kwargs, timeout=NONSTREAM_TIMEOUT_S)
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
                    why = "unreachable" if isinstance(e, anthropic.APIConnectionError) else "unavailable"
                    raise ProposalFailed(f"Anthropic API {why} after {self.retries} retries ({status}: "
                                         f"{_api_message(e)})", record=False) from None
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
            except anthropic.APIStatusError as e:
                raise ProposalFailed(f"Anthropic API error ({e.status_code} {_api_message(e)})", record=False) from None
        raise AssertionError("unreachable")

    def _stream(self, ctx: ProposalContext, kwargs: dict) -> Any:
        emitted, raw, tool = 0, "", None
        with self.client.messages.stream(**kwargs) as stream:
            for event in stream:
                if event.type == "content_block_start":
                    raw, tool = "", getattr(event.content_block, "name", None)
                # only a whole-file submission streams out as a partial proposal (a draft's source is not one)
                if event.type != "input_json" or ctx.emit is None or tool != "submit_implementation":
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
        parts.append(self._evidence_text(ctx))
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

    def _evidence_text(self, ctx: ProposalContext) -> str:
        ev = ctx.device_evidence
        if ev is None:
            return "Compile stats and floor fractions: not available in this search."
        if not ev.cuda:
            return "Compile stats and floor fractions: not available on the CPU interpreter."
        pid = ctx.parent.get("id")
        text = (f"What the compiler made of #{pid}'s kernels:\n{json.dumps(ev.compile_stats(pid), default=str)}\n"
                f"Per cell, how far #{pid} is from the hardware floor:\n{json.dumps(ev.floors(pid), default=str)}")
        # the newest candidate from this parent that failed in evaluation: what its kernels compiled to
        failed = next((a for a in sorted(ctx.attempts or [], key=lambda a: -int(a.get("id") or 0))
                       if a.get("status") == "failed" and a.get("failure")), None) if ctx.evidence else None
        if failed is not None:
            text += (f"\nWhat the compiler made of the failed candidate #{failed['id']}'s kernels:\n"
                     f"{json.dumps(ev.compile_stats(int(failed['id'])), default=str)}")
        return text

    # ------------------------------------------------------------------ tools

    def _tool(self, ctx: ProposalContext, name: str, args: dict) -> Any:
        st = ctx.store
        if name in {"read_evidence", "profile_cell", "time_draft"}:
            return self._device_tool(ctx, name, args)
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

    def _device_tool(self, ctx: ProposalContext, name: str, args: dict) -> Any:
        ev = ctx.device_evidence
        if ev is None:
            return {"error": "no device evidence in this search"}
        if name == "time_draft":
            source = args.get("source")
            if args.get("edits") is not None:
                source = apply_edits(ctx.parent_source, args["edits"])
            if not isinstance(source, str) or not source.strip():
                return {"error": "give edits or a source"}
            return ev.time_draft(ctx.parent_source, source, args.get("cells"), args.get("rounds"))
        impl = ctx.store.implementation(int(args["id"])) if ctx.store is not None else None
        if impl is None or impl.get("op") != ctx.op:
            return {"error": f"no implementation #{args['id']} of {ctx.op}"}
        if name == "read_evidence":
            return {"compile": ev.compile_stats(impl["id"]), "floors": ev.floors(impl["id"])}
        return ev.profile(impl["id"], str(args["cell"]))

    # ------------------------------------------------------------------ the conversation

    def propose(self, ctx: ProposalContext) -> Proposal:
        usage = {"model": self.model, "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                 "cache_write_tokens": 0, "cost_usd": 0.0, "calls": 0}
        if cost_usd(self.model, 0, 0, 0, 0) is None:
            usage["cost_usd"] = None  # a model without a price: its cost is unknown, not zero
        system = self.system_prompt(ctx)
        messages: list[dict] = [{"role": "user", "content": self.first_turn(ctx)}]
        entries = tuple(ctx.contract.get("entries") or ())
        for _turn in range(self.max_turns):
            spent = usage["input_tokens"] + usage["output_tokens"] + usage["cache_read_tokens"] \
                + usage["cache_write_tokens"]
            if (ctx.tokens_left is not None and spent >= ctx.tokens_left) or (
                    ctx.dollars_left is not None and usage["cost_usd"] is not None
                    and usage["cost_usd"] >= ctx.dollars_left):
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
                if use.get("name") == "edit_implementation":
                    try:
                        return self._edited(ctx, args, usage, entries, text)
                    except (EditError, ProposalFailed) as e:
                        # the model sees why and fixes the edit in this turn
                        results.append(_result(use["id"], {"error": str(e)}, True))
                        continue
                try:
                    out = self._tool(ctx, use.get("name", ""), args)
                    results.append(_result(use["id"], out, isinstance(out, dict) and "error" in out))
                except EditError as e:
                    results.append(_result(use["id"], {"error": str(e)}, True))
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
        return self._proposal(ctx, source, args, usage, text, "rewrite")

    def _edited(self, ctx: ProposalContext, args: dict, usage: dict, entries: tuple, text: str) -> Proposal:
        """The parent's source with the edits applied, as a complete file (EditError / ProposalFailed: not)."""
        source = check_source(apply_edits(ctx.parent_source, args.get("edits")), entries)
        if source == ctx.parent_source:
            raise EditError("the edits leave the source unchanged")
        added, removed = changed_lines(ctx.parent_source, source)
        return self._proposal(ctx, source, args, usage, text, "edit",
                              edits=len(args["edits"]), edit_lines=f"+{added} -{removed}")

    def _proposal(self, ctx: ProposalContext, source: str, args: dict, usage: dict, text: str, kind: str,
                  **extra: Any) -> Proposal:
        merged = [int(m) for m in (args.get("merged_from") or []) if str(m).isdigit()]
        mod: dict = {"kind": "merge" if merged else kind, "model": self.model, **extra}
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
    cost = cost_usd(model, inp, out, cw, cr)
    total["cost_usd"] = None if cost is None or total["cost_usd"] is None else round(total["cost_usd"] + cost, 6)
    total["calls"] += 1


def _clean_block(b: dict) -> dict:
    """An assistant block as the API accepts it back (no SDK-only fields)."""
    if b.get("type") == "text":
        return {"type": "text", "text": b.get("text", "")}
    if b.get("type") == "tool_use":
        return {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b.get("input", {})}
    # thinking blocks go back unchanged (signature included): the 5.x models bind them to the conversation
    if b.get("type") == "thinking":
        return {"type": "thinking", "thinking": b.get("thinking", ""), "signature": b.get("signature", "")}
    if b.get("type") == "redacted_thinking":
        return {"type": "redacted_thinking", "data": b.get("data", "")}
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
