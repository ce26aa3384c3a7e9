"""One readable line per event, for the UI's event log and `tik search`'s progress on stderr.

Sentences, not payload dumps: `evaluated: verified, 0.950× root`, `expanding #12 (score 0.41)`. The
derivation an event is about is printed once, by the caller, before this text; a reason that repeats
it (`#14: every config tried`) loses that prefix. Ratios follow tik_tui.verdict (time ×reference).
Pure Python: the command line imports it.
"""

from __future__ import annotations

import re

from tik_tui.verdict import x

#: payload keys that are bookkeeping, never shown
_HIDDEN = ("search", "op", "impl_id", "trace", "worker", "source")


def _strip_id(text: str, impl_id: int | None) -> str:
    """`#14: every config tried` -> `every config tried` when the line already names #14."""
    if impl_id is None:
        return text
    return re.sub(rf"^#{impl_id}\s*:\s*", "", text)


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _fallback(p: dict) -> str:
    bits = []
    for k, v in p.items():
        if k in _HIDDEN or k == "id" or v in (None, "", [], {}):
            continue
        if isinstance(v, str | int | float | bool):
            s = _num(v)
            bits.append(f"{k.replace('_', ' ')} {s if len(s) <= 60 else s[:57] + '...'}")
    return ", ".join(bits)


def _evaluated(p: dict, impl_id: int | None) -> str:
    """`verified, 1.012× incumbent: not faster than the incumbent` — the status and, short of eligible, why."""
    status = str(p.get("status"))
    if p.get("failure"):
        return f"{status}: {p['failure']}"
    obj, inc = p.get("objective"), p.get("incumbent_objective")
    vs = float(obj) / float(inc) if obj is not None and inc else None
    out = status + (f", {x(vs, 'incumbent')}" if vs is not None else "")
    if status != "verified":
        return out
    if obj is None:
        return out + ": not timed, so not eligible (a CPU search times candidates only with --time)"
    if vs is not None and vs >= 1.0:
        return out + ": not faster than the incumbent"
    show = f" (tik show {p.get('id', impl_id)} says which)" if p.get("id", impl_id) is not None else ""
    return out + f": not admissible, a cell is above its limit{show}"


def describe(kind: str, p: dict, *, impl_id: int | None = None, ratio: float | None = None) -> str:
    """The gist of event `kind` with payload `p`. `ratio`: the derivation's time ×root, when the caller
    knows it (the UI's snapshot does; an event alone does not)."""
    reason = _strip_id(str(p.get("reason") or ""), impl_id)
    if kind == "implementation":
        parents = p.get("parents") or []
        return f"new from #{parents[0]} by {p.get('proposer')}" if parents else f"new root by {p.get('proposer')}"
    if kind == "evaluation":
        out = f"{p.get('from')} → {p.get('status')}"
        if ratio is not None:
            out += f", {x(ratio, 'root')}"
        return out + (f": {p['failure']}" if p.get("failure") else "")
    if kind == "evaluated":
        return _evaluated(p, impl_id)
    if kind == "decision":
        return f"{p.get('action')} by {p.get('by')}" + (f": {p['reason']}" if p.get("reason") else "")
    if kind == "decided":
        return f"promoted by {p.get('by') or 'auto-promote'}"
    if kind == "queued":
        return f"eligible: queued for approval (tik approve {p.get('id', impl_id)})"
    if kind == "status":
        return f"{p.get('from')} → {p.get('to')}" + (f": {p['detail']}" if p.get("detail") else "")
    if kind == "worker":
        return f"{p.get('from')} → {p.get('state')}" + (f": {p['message']}" if p.get("message") else "")
    if kind == "command":
        return f"{p.get('kind')} requested"
    if kind == "selected":
        merge = f" with #{p['merge_with']}" if p.get("merge_with") else ""
        what = f" #{p['parent']}" if p.get("parent") != impl_id else ""
        return f"selected{what}{merge} to derive from" + (f" ({reason})" if reason else "")
    if kind == "proposed":
        rationale = str(p.get("rationale") or "").strip()
        what = "proposed" if p.get("id") == impl_id else f"proposed #{p.get('id')}"
        return f"{what}: {rationale.splitlines()[0][:100]}" if rationale else what
    if kind == "evaluating":
        return "evaluating" + (f" (attempt {p['attempt']})" if p.get("attempt") else "")
    if kind == "resume_evaluate":
        return "evaluating what a stopped worker left unevaluated"
    if kind == "exhausted":
        return f"nothing left to try: {reason}" if reason else "nothing left to try"
    if kind == "duplicate":
        return f"proposal repeated #{p.get('of')}: not recorded again"
    if kind == "eval_retry":
        return f"evaluation lost, retrying: {reason}"
    if kind == "retime":
        return f"re-timing against the new incumbent #{p.get('incumbent')} (was #{p.get('was')})"
    if kind in ("proposal_failed", "proposal_error"):
        return f"proposal failed: {reason}"
    if kind == "llm_retry":
        return f"LLM call failed ({p.get('status')}), retry {p.get('attempt')} in {_num(p.get('delay_s'))} s"
    if kind == "search_started":
        ops = ", ".join(p.get("ops") or []) or "all operators"
        return f"started: {ops}, proposer {p.get('proposer')}, budget {p.get('budget')}" + (
            ", auto-promote" if p.get("auto_promote") else "")
    if kind == "search_finished":
        return f"finished: {p.get('stop_reason') or 'done'}; {p.get('spent', 0)} derivation(s)" + (
            f", ${float(p['cost_usd']):.4f}" if p.get("cost_usd") else "")
    # the three search_* kinds show under the label "search": the text does not repeat it
    if kind == "search_resumed":
        return "took over the search of a stopped worker" + (
            f" (pid {p['previous_pid']})" if p.get("previous_pid") else "")
    if kind in ("paused", "resumed"):
        return kind
    if kind == "screen":
        from tik_tui.agent.tuner import screen_summary

        return screen_summary(p)
    if kind == "operator":
        return "contract changed" if p.get("was") else "operator added"
    if "message" in p:
        return str(p["message"])
    if reason:
        return reason
    return _fallback(p)
