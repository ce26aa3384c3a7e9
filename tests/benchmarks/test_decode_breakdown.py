"""benchmarks/decode_breakdown.py on the CPU: the code path, and that the recorded step is the engine's."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import decode_breakdown as DB  # noqa: E402
from tik_kernels.e2e.model import PRESETS  # noqa: E402


def test_every_call_of_a_step_is_recorded_and_grouped(tmp_path):
    assert DB.main(["--device", "cpu", "--preset", "tiny", "--batch", "2", "--context", "8", "--out",
                    str(tmp_path), "--backends", "unified"]) == 0
    doc = json.loads((tmp_path / "decode_breakdown_cpu_tiny.json").read_text())
    (b,) = doc["backends"]
    mc = PRESETS["tiny"]
    counts = {}
    for r in b["rows"]:
        counts[r["op"]] = counts.get(r["op"], 0) + r["count"]
    # per layer: the stacked qkv, o, gate_up, down; one attention; the step: one embedding, one token with its log-prob
    assert counts["linear"] == 4 * mc.layers
    assert counts["attention_decode"] == mc.layers
    assert counts["embedding"] == counts["sample_logprob"] == 1
    assert sum(r["count"] for r in b["rows"]) == b["calls"]
    # the layers repeat their shapes, so there are fewer distinct calls than calls
    assert b["distinct"] < b["calls"]
    assert (tmp_path / "decode_breakdown_cpu_tiny.md").read_text().count("| linear |") >= 2


def test_calls_with_other_shapes_are_not_grouped():
    import torch

    a, b = torch.zeros(2, 3), torch.zeros(2, 4)
    assert DB.signature("linear", (a, a)) != DB.signature("linear", (a, b))
    assert DB.signature("attention_decode", (a, 128)) != DB.signature("attention_decode", (a, 256))
    assert DB.signature("linear", (a, a)) == DB.signature("linear", (torch.ones(2, 3), a))


def test_no_gpu_is_a_one_line_refusal(capsys):
    if __import__("torch").cuda.is_available():
        pytest.skip("a GPU is here")
    assert DB.main(["--out", "/tmp/x"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_overrides_set_a_roots_config_and_refuse_unknown_keys(monkeypatch):
    import tik_kernels.ops.attention as A

    monkeypatch.setitem(A.CONFIG, "decode_num_stages", A.CONFIG["decode_num_stages"])
    assert DB.apply_overrides(["attention.decode_num_stages=1"]) == {"attention.decode_num_stages": 1}
    assert A.CONFIG["decode_num_stages"] == 1
    for bad in ("attention.no_such_key=1", "nosuchop.x=1", "attention.decode_num_stages=two", "nodot=1"):
        with pytest.raises(ValueError):
            DB.apply_overrides([bad])


def test_top_kernels_names_what_a_call_spends_its_time_on():
    """`--kernels`: the profiler's view of one call (on the CPU its top-level ops; on a GPU its kernels)."""
    import torch

    x, w = torch.randn(64, 256), torch.randn(512, 256)

    def call(x, w):
        return torch.nn.functional.linear(x, w).softmax(-1).argmax(-1)

    rows = DB.top_kernels(call, (x, w), 5, calls=2, device="cpu")
    names = [r["name"] for r in rows]
    assert rows and any("linear" in n or "addmm" in n or "mm" in n for n in names), names
    assert all(r["us_per_call"] >= 0 and r["count"] > 0 for r in rows)
    assert [r["us_per_call"] for r in rows] == sorted((r["us_per_call"] for r in rows), reverse=True)


def test_kernels_flag_lists_them_in_the_report(tmp_path):
    assert DB.main(["--device", "cpu", "--preset", "tiny", "--batch", "2", "--context", "8", "--out",
                    str(tmp_path), "--backends", "stock", "--kernels", "3", "--name", "_k"]) == 0
    doc = json.loads((tmp_path / "decode_breakdown_cpu_tiny_k.json").read_text())
    assert all(r.get("kernels") for r in doc["backends"][0]["rows"])
    assert "What each call runs" in (tmp_path / "decode_breakdown_cpu_tiny_k.md").read_text()


def test_a_negative_kernel_count_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        DB.main(["--kernels", "-1", "--device", "cpu"])
    assert e.value.code == 2 and "--kernels" in capsys.readouterr().err
