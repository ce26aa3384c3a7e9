"""benchmarks/bench_speed.py end to end on the CPU (--smoke: interpreter, tiny shapes, eager timing), its bits
gate with a planted batch-variant linear, and what it may import."""

import ast
import json
import sys
from pathlib import Path

import pytest

from benchmarks import bench_speed
from benchmarks import harness as H

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {"linear_geomean", "linear_worst", "linear_m_le_16_geomean", "decode_geomean", "decode_worst",
                "prefill_geomean", "fwd_bwd_geomean", "fwd_bwd_varlen_geomean"}

#: a linear whose rows follow the batch size (a split that changes with M): the gate must go red
BATCH_VARIANT_LINEAR = '''
import torch

def linear(x, w):
    y = x.float() @ w.float().T
    if x.shape[0] > 1:
        y = y * (1 + 2 ** -6)
    return y.to(x.dtype)
'''


def test_smoke_end_to_end(tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"kept": 1}))
    assert bench_speed.main(["--smoke", "--out", str(tmp_path), "--summary", str(summary)]) == 0
    doc = json.loads((tmp_path / "speed_smoke.json").read_text())
    assert list(doc["sections"]) == list(bench_speed.SECTIONS)
    for section, rows in doc["sections"].items():
        assert rows, section
        for r in rows:
            assert r["gate_green"] and r["ratio"] > 0, r
            assert r["timing"]["contenders"]["tik"]["fallback"].startswith("eager")
    assert doc["env"]["git_commit"] and doc["command"].startswith("PYTHONPATH=. python benchmarks/bench_speed.py")
    assert doc["attention_forward"] == "triton"  # the interpreter; on a Hopper GPU the root's forward is "gluon"
    s = json.loads(summary.read_text())
    assert SUMMARY_KEYS <= set(s) and all(s[k] > 0 for k in SUMMARY_KEYS)
    assert s["kept"] == 1 and s["_provenance"]["decode_worst"]["file"].endswith("speed_smoke.json")
    md = (tmp_path / "speed_smoke.md").read_text()
    assert "lower is better" in md and "| linear_geomean |" in md


def test_red_gate_withholds_ratios(tmp_path):
    impl = tmp_path / "variant_linear.py"
    impl.write_text(BATCH_VARIANT_LINEAR)
    summary = tmp_path / "summary.json"
    rc = bench_speed.main(["--smoke", "--only", "linear", "--impl", f"linear={impl}", "--out", str(tmp_path),
                           "--summary", str(summary)])
    assert rc == 1
    rows = json.loads((tmp_path / "speed_smoke.json").read_text())["sections"]["linear"]
    red = [r for r in rows if not r["gate_green"]]
    assert red and all("ratio" not in r and "timing" not in r for r in red)
    assert any(r["gate_green"] for r in rows)  # M = 1 has no other row to differ from
    s = json.loads(summary.read_text())
    assert s["linear_geomean"] is None and s["linear_worst"] is None
    assert "RED" in (tmp_path / "speed_smoke.md").read_text()


def test_impl_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench_speed.main(["--smoke", "--impl", "nosuchop=x.py", "--out", str(tmp_path)])
    assert "OP=FILE" in str(e.value)
    with pytest.raises(SystemExit) as e:
        bench_speed.main(["--smoke", "--impl", f"linear={tmp_path / 'missing.py'}", "--out", str(tmp_path)])
    assert "no file" in str(e.value)


@pytest.mark.skipif(bench_speed.tik_kernels.DEVICE == "cuda", reason="checks the CPU refusal")
def test_needs_gpu_without_smoke(tmp_path):
    assert bench_speed.main(["--out", str(tmp_path)]) == 2


def _imports(path: Path) -> set:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_imports_only_torch_triton_tik_kernels_and_the_harness():
    allowed = set(sys.stdlib_module_names) | {"torch", "triton", "tik_kernels", "benchmarks"}
    for name in ("bench_speed.py", "harness.py"):
        extra = _imports(ROOT / "benchmarks" / name) - allowed
        assert not extra, f"{name} imports {extra}"
    tree = ast.parse((ROOT / "benchmarks" / "bench_speed.py").read_text())
    from_benchmarks = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "benchmarks"
                       for a in n.names}
    assert from_benchmarks == {"harness"}


def test_section_summary_withholds_on_failed_cells():
    ok = [{"cell": "a", "M": 1, "ratio": 0.5, "gate_green": True},
          {"cell": "b", "M": 64, "ratio": 2.0, "gate_green": True}]
    s = bench_speed.section_summary("linear", ok)
    assert s["linear_geomean"] == pytest.approx(1.0) and s["linear_worst"] == 2.0
    assert s["linear_m_le_16_geomean"] == pytest.approx(0.5)
    mem = ok + [{"cell": "c", "M": 4, "skipped": "does not fit in GPU memory"}]
    assert bench_speed.section_summary("linear", mem) == s  # a memory skip is reported, not a failure
    failed = ok + [{"cell": "c", "M": 4, "error": "RuntimeError: boom"}]
    assert set(bench_speed.section_summary("linear", failed).values()) == {None}
    red = ok + [{"cell": "d", "M": 4, "gate_green": False}]
    assert set(bench_speed.section_summary("linear", red).values()) == {None}


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_quick_on_gpu_replays_graphs(tmp_path):
    """On the GPU: the quick cells of linear and decode pass the bits gate and every timed row replayed graphs; the
    file carries the card's name."""
    rc = bench_speed.main(["--quick", "--only", "linear", "--only", "decode", "--rounds", "3", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / f"speed_{H.card_tag('cuda')}_linear_decode_quick.json").read_text())
    rows = [r for rs in doc["sections"].values() for r in rs if "skipped" not in r]
    assert rc == 0 and rows and all(r["gate_green"] and r["graph"] and r["ratio"] > 0 for r in rows), rows
    assert all(not r["timing"]["below_l2_factor"] for r in rows)
    assert not (tmp_path / "summary_h200.json").exists()  # --quick never writes the summary


def test_result_files_carry_the_cards_name_and_a_card_writes_only_its_own_summary(tmp_path, monkeypatch, capsys):
    ns = type("A", (), {"smoke": False, "only": ["linear"], "quick": False, "impl": []})()
    assert bench_speed.out_name(ns, "h100") == "speed_h100_linear"
    assert bench_speed.out_name(ns, "h200") == "speed_h200_linear"
    assert H.summary_path(tmp_path, "h100") == tmp_path / "summary_h100.json"
    assert H.summary_card(tmp_path / "summary_h200.json") == "h200" and H.summary_card(tmp_path / "x.json") is None
    assert H.gpu_tag("NVIDIA H100 80GB HBM3") == "h100" and H.gpu_tag("NVIDIA H200") == "h200"
    monkeypatch.setattr(bench_speed.tik_kernels, "DEVICE", "cuda")
    monkeypatch.setattr(bench_speed.H, "card_tag", lambda device: "h100")
    summary = tmp_path / "summary_h200.json"
    rc = bench_speed.main(["--only", "linear", "--out", str(tmp_path), "--summary", str(summary)])
    assert rc == 2 and "H200 figures" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_variants_time_beside_the_default_and_a_bits_moving_one_goes_red(tmp_path, capsys):
    """--variant: a launch choice timed in the same rounds (its ratio beside the default's), one that moves the
    tree's bits (the interpreter's key block) red and untimed, an unknown key an error; the summary stays the
    default's."""
    rc = bench_speed.main(["--smoke", "--only", "prefill", "--out", str(tmp_path),
                           "--variant", "warps=attention.num_warps=4",
                           "--variant", "tree=attention.BLOCK_N_INTERPRET=8",
                           "--variant", "nokey=attention.NO_SUCH_KEY=1"])
    assert rc == 0
    doc = json.loads((tmp_path / "speed_smoke.json").read_text())
    assert doc["variants"]["warps"] == {"attention": {"num_warps": 4}}
    for r in doc["sections"]["prefill"]:
        assert r["variant_gate"] == {"warps": True, "tree": False, "nokey": "attention has no tunable NO_SUCH_KEY"}
        assert set(r["variant_ratio"]) == {"warps"} and r["variant_ratio"]["warps"] > 0
        assert set(r["timing"]["contenders"]) == {"tik", "sdpa_flash", "tik:warps"}
    md = (tmp_path / "speed_smoke.md").read_text()
    assert "warps: {'attention': {'num_warps': 4}}" in md and "tree RED (other bits)" in md


@pytest.mark.parametrize("spec", ["noequals", "x=attention", "x=attention.BLOCK_M", "x=attention.BLOCK_M=big",
                                  "x=nosuchop.K=1", "=attention.BLOCK_M=64"])
def test_a_malformed_variant_is_one_argparse_error(tmp_path, capsys, spec):
    with pytest.raises(SystemExit) as e:
        bench_speed.main(["--smoke", "--out", str(tmp_path), "--variant", spec])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--variant takes NAME=OP.KEY=INTEGER" in err and "Traceback" not in err
