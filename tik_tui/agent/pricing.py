"""What a Claude model costs and which request options it accepts.

Prices are US$ per million tokens from Anthropic's pricing page (platform.claude.com, read 2026-12-03):
base input, output, 5-minute cache write, cache read. Where a page gives only input and output, cache
writes are 1.25x input and reads 0.1x input (the published multipliers). A model missing here has no
price: its cost is `None` ("unknown" in the UI and the log), never another model's rates, and a search
with `--max-cost` refuses to start on it (it could not tell when to stop).

Capabilities say which `thinking` types and `output_config.effort` levels a model accepts: a request
carries only what the chosen model takes, because the 5.x models answer 400 to the rest (Sonnet 5 to
manual extended thinking; Opus 5.5 and the Fable 5.1+ models to turning thinking off). Nothing is sent
by default (each model's own default applies), and sampling parameters (temperature, top_p) never are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rates:
    """US$ per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float
    #: prompts over `long_prompt` tokens (input + cache reads + cache writes) bill every token at `long` rates
    long_prompt: int | None = None
    long: tuple[float, float, float, float] | None = None


def _std(inp: float, out: float, read: float | None = None) -> Rates:
    return Rates(inp, out, round(inp * 1.25, 4), read if read is not None else round(inp * 0.1, 4))


#: model id (without a date suffix) -> rates
PRICES: dict[str, Rates] = {
    # Fable / Mythos share specifications and prices; 5.1 cut cache reads to $0.25, 5.2 to $8 / $40
    "claude-fable-5-2": _std(8.0, 40.0, 0.20),
    "claude-mythos-5-2": _std(8.0, 40.0, 0.20),
    "claude-fable-5-1": _std(10.0, 50.0, 0.25),
    "claude-mythos-5-1": _std(10.0, 50.0, 0.25),
    "claude-fable-5": _std(10.0, 50.0, 1.00),
    "claude-mythos-5": _std(10.0, 50.0, 1.00),
    "claude-opus-5-5": _std(4.0, 20.0, 0.20),
    "claude-opus-5": _std(5.0, 25.0),
    "claude-opus-4-8": _std(5.0, 25.0),
    "claude-opus-4-7": _std(5.0, 25.0),
    "claude-opus-4-6": _std(5.0, 25.0),
    "claude-opus-4-5": _std(5.0, 25.0),
    "claude-opus-4-1": _std(15.0, 75.0),
    "claude-opus-4-0": _std(15.0, 75.0),
    "claude-opus-4": _std(15.0, 75.0),
    # Sonnet 5.5's cache reads went from $0.20 to $0.10 on 2026-10-07
    "claude-sonnet-5-5": _std(2.0, 10.0, 0.10),
    "claude-sonnet-5": _std(2.0, 10.0, 0.20),
    "claude-sonnet-4-6": _std(3.0, 15.0),
    "claude-sonnet-4-5": _std(3.0, 15.0),
    "claude-sonnet-4-0": _std(3.0, 15.0),
    "claude-sonnet-4": _std(3.0, 15.0),
    # Haiku 5.5 has two bands: a prompt over 100k tokens pays 5x on every token of that request
    "claude-haiku-5-5": Rates(0.10, 0.50, 0.125, 0.01, long_prompt=100_000, long=(0.50, 2.50, 0.625, 0.05)),
    "claude-haiku-4-5": _std(1.0, 5.0),
}

_DATE = re.compile(r"-\d{8}$")


def family(model: str) -> str:
    """The table key of a model id: the id itself, less a `-YYYYMMDD` snapshot suffix."""
    return _DATE.sub("", model)


def rates(model: str) -> Rates | None:
    """The model's rates, or None when it is not in the table (never a neighbour's: claude-sonnet-5-7 is
    not claude-sonnet-5)."""
    return PRICES.get(family(model))


def cost_usd(model: str, input_tokens: int, output_tokens: int, cache_write: int, cache_read: int) -> float | None:
    """Dollars for one call's usage; None for a model without a price."""
    r = rates(model)
    if r is None:
        return None
    p = (r.input, r.output, r.cache_write, r.cache_read)
    if r.long_prompt is not None and r.long and input_tokens + cache_write + cache_read > r.long_prompt:
        p = r.long
    return (input_tokens * p[0] + output_tokens * p[1] + cache_write * p[2] + cache_read * p[3]) / 1e6


def priced(model: str | None) -> bool:
    return bool(model) and rates(str(model)) is not None


def check_max_cost(model: str) -> None:
    """A dollar budget needs a price to count against: ValueError (one line) for a model without one."""
    if not priced(model):
        raise ValueError(f"--max-cost needs a model with a known price, and {model} has none "
                         "(tik_tui/agent/pricing.py): choose another --model or leave out --max-cost")


def unpriced_use(by_model: dict | None) -> bool:
    """Whether usage totals per model (`llm_usage_totals()["by_model"]`) hold tokens no price was put on: a model
    without a price whose recorded cost is 0 (a cost recorded by an older table or a replay file stands)."""
    return any(not priced(name) and not row.get("cost_usd") and (row.get("input_tokens") or row.get("output_tokens"))
               for name, row in (by_model or {}).items())


def money(usd: float | None, model_unpriced: bool = False) -> str:
    """`$1.2345`, or `unknown` (a model without a price); `$1.23 + unknown` when only part is priced."""
    if usd is None or (model_unpriced and not usd):
        return "unknown"
    return f"${usd:.4f}" + (" + unknown" if model_unpriced else "")


# ----------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class Caps:
    """`thinking` types a model accepts, its effort levels (empty: no effort parameter) and the thinking type
    that turns thinking off there (None: it cannot be turned off)."""

    thinking: frozenset[str]
    effort: tuple[str, ...] = ()
    off: str | None = "disabled"
    #: thinking can be turned off only at these effort levels (Opus 5, Haiku 5.5: high or lower)
    off_efforts: tuple[str, ...] | None = None


_LEVELS5 = ("low", "medium", "high", "xhigh", "max")
_ADAPTIVE_ONLY = Caps(frozenset({"adaptive"}), _LEVELS5, off=None)
_UP_TO_HIGH = ("low", "medium", "high")

CAPS: dict[str, Caps] = {
    **{m: _ADAPTIVE_ONLY for m in ("claude-fable-5-2", "claude-mythos-5-2", "claude-fable-5-1", "claude-mythos-5-1",
                                   "claude-fable-5", "claude-mythos-5", "claude-opus-5-5", "claude-opus-4-8",
                                   "claude-opus-4-7")},
    "claude-opus-5": Caps(frozenset({"adaptive", "disabled"}), _LEVELS5, off_efforts=_UP_TO_HIGH),
    "claude-sonnet-5-5": Caps(frozenset({"adaptive", "between_tools"}), _LEVELS5, off="between_tools"),
    # Sonnet 5: manual extended thinking is a 400
    "claude-sonnet-5": Caps(frozenset({"adaptive"}), _LEVELS5, off=None),
    "claude-haiku-5-5": Caps(frozenset({"adaptive", "disabled"}), _LEVELS5, off_efforts=_UP_TO_HIGH),
    "claude-opus-4-6": Caps(frozenset({"adaptive", "enabled", "disabled"}), ("low", "medium", "high", "max")),
    "claude-sonnet-4-6": Caps(frozenset({"adaptive", "enabled", "disabled"}), ("low", "medium", "high")),
    "claude-opus-4-5": Caps(frozenset({"enabled", "disabled"})),
    "claude-sonnet-4-5": Caps(frozenset({"enabled", "disabled"})),
    "claude-haiku-4-5": Caps(frozenset({"enabled", "disabled"})),
    "claude-opus-4-1": Caps(frozenset({"enabled", "disabled"})),
}


def request_options(model: str, thinking: str | None = None, effort: str | None = None,
                    max_tokens: int = 32000) -> dict:
    """The `thinking` / `output_config` fields for `model`, or ValueError (one line) for what it would reject.

    thinking: None (the model's default, nothing sent), "adaptive", "off", or a token budget ("8000": manual
    extended thinking, older models only). effort: None or one of the model's levels."""
    if thinking is None and effort is None:
        return {}
    caps = CAPS.get(family(model))
    if caps is None:
        raise ValueError(f"no known thinking/effort options for model {model!r}: leave out --thinking and --effort")
    out: dict = {}
    if effort is not None:
        if effort not in caps.effort:
            have = ", ".join(caps.effort) if caps.effort else "none"
            raise ValueError(f"{model} does not take effort {effort!r} (its levels: {have})")
        out["output_config"] = {"effort": effort}
    if thinking is None:
        return out
    t = str(thinking).strip().lower()
    if t == "adaptive":
        if "adaptive" not in caps.thinking:
            raise ValueError(f"{model} has no adaptive thinking (use a token budget, e.g. --thinking 8000)")
        out["thinking"] = {"type": "adaptive"}
    elif t == "off":
        if caps.off is None:
            raise ValueError(f"{model} cannot turn thinking off (lower --effort instead)")
        if caps.off_efforts is not None and effort not in caps.off_efforts:
            raise ValueError(f"{model} turns thinking off only with --effort {' / '.join(caps.off_efforts)}")
        out["thinking"] = {"type": caps.off}
    elif t.isdigit():
        if "enabled" not in caps.thinking:
            raise ValueError(f"{model} rejects a thinking budget (manual extended thinking): use --thinking adaptive")
        budget = int(t)
        if not 1024 <= budget < max_tokens:
            raise ValueError(f"thinking budget must be at least 1024 and below max_tokens ({max_tokens})")
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    else:
        raise ValueError(f"--thinking takes adaptive, off or a token budget, not {thinking!r}")
    return out
