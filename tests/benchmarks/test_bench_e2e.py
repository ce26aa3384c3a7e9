"""bench_e2e's CPU code paths: the multi-seed learning curves (CSV + PNG) and the decode step vs its floor."""

from __future__ import annotations

import csv
import json
import sys
import zlib

import pytest

from benchmarks import bench_e2e


def test_learning_curves_over_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_e2e.py", "--only", "learning", "--device", "cpu", "--learn-preset", "tiny",
                                      "--learn-steps", "2", "--learn-modes", "A", "--learn-prompts", "2",
                                      "--learn-group", "2", "--seeds", "0", "1", "2", "--out", str(tmp_path)])
    assert bench_e2e.main() == 0
    rows = list(csv.DictReader(open(tmp_path / "e2e_learning_seeds.csv")))
    assert [r["step"] for r in rows] == ["0", "1"]
    for r in rows:
        seeds = [float(r[f"A_seed{s}"]) for s in range(3)]
        assert float(r["A_min"]) == min(seeds) and float(r["A_max"]) == max(seeds)
        assert abs(float(r["A_mean"]) - sum(seeds) / 3) < 1e-4
    png = (tmp_path / "e2e_learning_seeds.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" in png
    doc = json.loads((tmp_path / "e2e_cpu_learning_seeds_full.json").read_text())
    assert doc["learning"]["seeds"] == [0, 1, 2] and len(doc["learning"]["curves"]["A"]) == 3


def test_band_png_is_a_valid_image(tmp_path):
    p = tmp_path / "x.png"
    bench_e2e.write_band_png(p, [([0.1, 0.5, 0.3], [0.0, 0.4, 0.2], [0.2, 0.6, 0.4])], w=40, h=20)
    data = p.read_bytes()
    # IHDR says 40 x 20 RGB; the IDAT inflates to one filter byte + 40 * 3 bytes per row
    assert int.from_bytes(data[16:20], "big") == 40 and int.from_bytes(data[20:24], "big") == 20
    n = int.from_bytes(data[33:37], "big")
    assert data[37:41] == b"IDAT"
    raw = zlib.decompress(data[41 : 41 + n])
    assert len(raw) == 20 * (1 + 40 * 3)
    assert any(b != 0xFF for b in raw[1:])  # something was drawn


def test_decode_bench_cpu_path(tmp_path, monkeypatch):
    # stock only: the unified decode runs in the interpreter here, and the timing code is the same for both
    monkeypatch.setattr(sys, "argv", ["bench_e2e.py", "--only", "decode", "--device", "cpu", "--decode-preset", "tiny",
                                      "--decode-batch", "2", "--decode-context", "8", "16", "--decode-backends",
                                      "stock", "--out", str(tmp_path)])
    assert bench_e2e.main() == 0
    doc = json.loads((tmp_path / "e2e_cpu_decode_full.json").read_text())
    runs = doc["decode"]["runs"]
    assert [r["context"] for r in runs] == [8, 16]
    assert all(not r["graphs"] and r["step_ms"] > 0 and r["floor_ms"] > 0 for r in runs)
    assert runs[0]["step_over_floor"] == runs[0]["step_ms"] / runs[0]["floor_ms"]
    assert runs[1]["bytes"]["kv_read"] == 2 * runs[0]["bytes"]["kv_read"]
    assert not (tmp_path / "summary_h200.json").exists()  # a CPU run writes no GPU summary keys
    assert doc["decode"]["card_tbps"] is None and "step_over_card_floor" not in runs[0]  # no card bandwidth here


def test_the_card_floor_scales_the_floor_by_the_measured_bandwidth():
    run = {"floor_ms": 1.0, "tbps": 4.2, "step_ms": 3.0, "replay_ms": 2.8}
    out = bench_e2e.card_floor(run, 3.0)
    assert out["card_floor_ms"] == pytest.approx(1.4) and out["step_over_card_floor"] == pytest.approx(3.0 / 1.4)
    assert out["replay_over_card_floor"] == pytest.approx(2.8 / 1.4)
    assert "replay_over_card_floor" not in bench_e2e.card_floor({k: v for k, v in run.items() if k != "replay_ms"}, 3)


def test_summary_keys_only_from_full_depth_gpu_runs():
    from argparse import Namespace

    gpu, cut, cpu = (Namespace(device="cuda", layers=None), Namespace(device="cuda", layers=4),
                     Namespace(device="cpu", layers=None))

    def mode(rollout, recompute, train):
        return {"steps_per_s": 1 / (rollout + recompute + train),
                "time_s": {"rollout": rollout, "recompute": recompute, "train": train}}

    # B's rollout and train, the same work as C's, timed 10% faster: the paired B / C keeps only the recompute
    modes = {"A": mode(4.0, 0.5, 3.0), "B": mode(1.8, 0.0, 1.8), "C": mode(2.0, 0.4, 2.0)}
    thr = {"qwen3-0.6b": {"config": {"layers": None}, "modes": {"B": mode(1, 0, 1), "C": mode(1, 8, 1)}},
           "qwen3-1.7b": {"config": {"layers": None}, "modes": modes}}
    keys = bench_e2e.summary_keys("throughput", thr, gpu)
    assert keys == pytest.approx({"e2e_B_over_C": (3.8 + 0.4) / 3.8, "e2e_B_over_C_unpaired": 4.4 / 3.6,
                                  "e2e_B_over_A": 7.5 / 3.6})
    assert bench_e2e.summary_keys("throughput", thr, cut) == {} == bench_e2e.summary_keys("throughput", thr, cpu)
    cut_run = {"qwen3-1.7b": {"config": {"layers": 4}, "modes": modes}}  # a saved cut run, read with --summarize
    assert bench_e2e.summary_keys("throughput", cut_run, gpu) == {}
    runs = [{"backend": b, "graphs": g, "batch": 64, "step_over_floor": r}
            for b, g, r in (("unified", True, 2.0), ("unified", True, 2.5), ("unified", False, 9.0),
                            ("stock", True, 1.5))]
    dec = {"preset": "qwen3-0.6b", "runs": runs}
    # the worst context of the graphed unified step; eager steps are not the figure
    assert bench_e2e.summary_keys("decode", dec, gpu) == {"e2e_decode_floor_ratio": 2.5,
                                                          "e2e_decode_floor_ratio_stock": 1.5}
    for r, c in zip(runs, (1.5, 1.8, 7.0, 1.1), strict=True):
        r["step_over_card_floor"] = c
    assert bench_e2e.summary_keys("decode", dec, gpu)["e2e_decode_card_floor_ratio"] == 1.8
    for r, c in zip(runs, (1.7, 2.2, 8.0, 1.2), strict=True):
        r["overlap_over_floor"] = c
    assert bench_e2e.summary_keys("decode", dec, gpu)["e2e_decode_queued_floor_ratio"] == 2.2
    assert bench_e2e.summary_keys("decode", dec, gpu)["e2e_decode_floor_ratio"] == 2.5  # the key unchanged
    assert bench_e2e.summary_keys("decode", dec | {"preset": "qwen3-1.7b"}, gpu) == {}


def test_config_overrides_are_restored():
    """The unified-s18 decode contender sets library CONFIG values for its own capture only, even when it fails."""
    import tik_kernels.ops.attention as A
    import tik_kernels.ops.linear as L

    before = (L.CONFIG["NARROW_PCT"], A.CONFIG["DECODE_FUSED_MAX_CHUNKS"])
    with bench_e2e.config_overrides(bench_e2e.S18_DECODE):
        assert (L.CONFIG["NARROW_PCT"], A.CONFIG["DECODE_FUSED_MAX_CHUNKS"]) == (0, 0)
    with pytest.raises(RuntimeError), bench_e2e.config_overrides(bench_e2e.S18_DECODE):
        raise RuntimeError("capture failed")
    assert (L.CONFIG["NARROW_PCT"], A.CONFIG["DECODE_FUSED_MAX_CHUNKS"]) == before


def test_decode_variant_runs_the_unified_step_with_its_config(tmp_path, monkeypatch):
    """--decode-variant NAME=OP.KEY=VALUE: the unified step under those CONFIG values, as backend unified:NAME; the
    CONFIG is the module's own again afterwards."""
    from tik_kernels.ops import logprob

    monkeypatch.setattr(sys, "argv", ["bench_e2e.py", "--only", "decode", "--device", "cpu", "--decode-preset", "tiny",
                                      "--decode-batch", "1", "--decode-context", "4", "--decode-backends", "stock",
                                      "--decode-variant", "nested=logprob.FLAT=0,logprob.SLP_STAGES=3", "--out",
                                      str(tmp_path)])
    before = dict(logprob.CONFIG)
    assert before["FLAT"] == 1 and before["SLP_STAGES"] == 4
    assert bench_e2e.main() == 0
    runs = json.loads((tmp_path / "e2e_cpu_decode_full.json").read_text())["decode"]["runs"]
    assert [r["backend"] for r in runs] == ["stock", "unified:nested"]
    assert all("error" not in r and r["step_ms"] > 0 for r in runs)
    assert logprob.CONFIG == before


@pytest.mark.parametrize("spec,says", [("flat=logprob.NOPE=1", "logprob has no CONFIG key NOPE"),
                                       ("flat=nosuchop.FLAT=1", "--decode-variant takes NAME=OP.KEY=INTEGER"),
                                       ("flat", "--decode-variant takes NAME=OP.KEY=INTEGER")])
def test_a_bad_decode_variant_is_one_line(tmp_path, monkeypatch, capsys, spec, says):
    monkeypatch.setattr(sys, "argv", ["bench_e2e.py", "--only", "decode", "--device", "cpu", "--decode-variant", spec,
                                      "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        bench_e2e.main()
    assert e.value.code == 2 and says in capsys.readouterr().err.strip().splitlines()[-1]


def test_decode_contenders_are_interleaved_round_by_round(tmp_path, monkeypatch):
    """--only decode builds every contender first, then times them a round at a time, the order rotating each round;
    each run's figures are the medians over its rounds."""
    from tik_kernels.e2e import decode_bench

    order = []
    real = decode_bench.DecodeTimer.round

    def spy(self, reps):
        order.append(self.backend_name)
        return real(self, reps)

    monkeypatch.setattr(decode_bench.DecodeTimer, "round", spy)
    monkeypatch.setattr(sys, "argv", ["bench_e2e.py", "--only", "decode", "--device", "cpu", "--decode-preset", "tiny",
                                      "--decode-batch", "1", "--decode-context", "4", "--decode-backends", "stock",
                                      "unified", "--decode-rounds", "3", "--out", str(tmp_path)])
    assert bench_e2e.main() == 0
    assert order == ["stock", "unified", "unified", "stock", "stock", "unified"]
    runs = json.loads((tmp_path / "e2e_cpu_decode_full.json").read_text())["decode"]["runs"]
    assert [(r["backend"], r["rounds"]) for r in runs] == [("stock", 3), ("unified", 3)]
