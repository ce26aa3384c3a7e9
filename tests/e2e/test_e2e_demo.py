"""`tik e2e` on the CPU shows the problem and its fix: at its default sizes the stock kernels' rollout log-probs
differ from the trainer's, the unified kernels' do not; and it says where it has got to while it runs."""

from __future__ import annotations

import io

from tik_kernels.e2e.run import CLI_DEFAULTS, E2EConfig, run_e2e
from tik_tui.cli.e2e_cmds import ProgressLine

CPU = CLI_DEFAULTS["cpu"]


def _config(**kw) -> E2EConfig:
    d = {k: v for k, v in CPU.items() if k != "modes"}
    return E2EConfig(preset="tiny", device="cpu", **(d | kw))


def test_cpu_default_sizes_show_a_stock_mismatch():
    events = []
    a = run_e2e(_config(modes=("A",)), on_progress=events.append)["modes"]["A"]
    assert a["tokens"] > 20
    assert a["equal_tokens"] < a["tokens"], a  # the stock rollout disagrees with the stock trainer
    # progress: every phase of the step reported, the rollout token by token, ending with the tokens it made
    done = [(e["phase"], e["tokens"]) for e in events if e["done"]]
    assert [p for p, _ in done] == ["rollout", "recompute", "train", "train"][: len(done)] and len(done) >= 3
    assert done[0][1] == a["tokens"]
    assert len([e for e in events if e["phase"] == "rollout"]) > 3


def test_the_old_short_sequences_hid_the_stock_mismatch():
    """What the defaults fixed: the old sizes (at most 15 tokens a sequence) never pad a batch to 16 keys, where stock
    CPU SDPA's bits start to depend on the padding, so stock was 100% equal too — a check for `> 0` mismatches fails
    there."""
    a = run_e2e(_config(modes=("A",), prompt_len=(3, 9)))["modes"]["A"]
    assert a["equal_tokens"] == a["tokens"]


def test_unified_kernels_match_at_the_default_sequence_lengths():
    """Mode B at the CPU default's sequence lengths (fewer requests, one update: the interpreter is slow)."""
    b = run_e2e(_config(modes=("B",), prompts=1, group=3, ppo_epochs=1))["modes"]["B"]
    assert b["tokens"] > 5
    assert b["equal_tokens"] == b["tokens"], b


def _ev(phase, tokens, seconds, done=False):
    return {"mode": "B", "step": 1, "steps": 2, "phase": phase, "tokens": tokens, "seconds": seconds, "done": done}


def test_progress_plain_lines_off_a_terminal():
    out = io.StringIO()
    line = ProgressLine(out, tty=False)
    for ev in (_ev("rollout", 0, 0.0), _ev("rollout", 10, 2.0), _ev("rollout", 34, 4.0, True), _ev("train", 0, 0),
               _ev("train", 292, 8.0, True)):
        line.update(ev)
    line.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert "mode B" in lines[0] and "step 1/2" in lines[0] and "rollout" in lines[0] and "8.5 tok/s" in lines[0]
    assert "train" in lines[1] and "36.5 tok/s" in lines[1]


def test_progress_one_line_in_place_on_a_terminal():
    out = io.StringIO()
    line = ProgressLine(out, tty=True, tick_s=60)
    line.update(_ev("rollout", 0, 0.0))
    line.update(_ev("rollout", 34, 4.0, True))
    line.close()
    text = out.getvalue()
    assert "\n" not in text
    assert text.count("\r\033[K") == 3  # two updates, then the line wiped
    assert "34 tokens" in text
