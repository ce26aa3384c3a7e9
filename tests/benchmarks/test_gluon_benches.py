"""benchmarks/bench_gluon_fwd.py and bench_gluon_linear.py end to end on the CPU (--smoke): the root standing in for
the Gluon forms (which need a Hopper GPU) and one planted form with other bits, so a GPU call never finds the
script's own faults: every cell timed, the planted form reported red, the others green, the report written."""

import json

import pytest

from benchmarks import bench_gluon_fwd, bench_gluon_linear


@pytest.mark.parametrize("bench,name,red,green,base", [
    (bench_gluon_fwd, "gluon_fwd_smoke", "gluon_m128", ("gluon", "gluon_own_step"), "triton"),
    (bench_gluon_linear, "gluon_linear_smoke", "gluon4", ("gluon8", "gluon_noswap"), "root"),
])
def test_smoke_end_to_end(tmp_path, bench, name, red, green, base):
    assert bench.main(["--smoke", "--out", str(tmp_path), "--rounds", "1"]) == 1  # the planted form's other bits
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["rows"] and not doc["bits_all"]
    for r in doc["rows"]:
        assert r["red"] == [red], r
        for n in (base, *green, red):
            assert r[f"{n}_us"] > 0 and r[f"{n}_ratio"] > 0, (n, r)
    assert all(doc[f"{n}_geomean"] > 0 for n in (base, *green, red))
    md = (tmp_path / f"{name}.md").read_text()
    assert f"red: {red}" in md


def test_smoke_with_the_warp_specialized_form(tmp_path):
    assert bench_gluon_fwd.main(["--smoke", "--ws", "--out", str(tmp_path), "--rounds", "1"]) == 1
    doc = json.loads((tmp_path / "gluon_fwd_ws_smoke.json").read_text())
    assert all(r["gluon_ws_ratio"] > 0 and r["red"] == ["gluon_m128"] for r in doc["rows"])
    assert doc["gluon_ws_geomean"] > 0 and not (tmp_path / "gluon_fwd_smoke.json").exists()
