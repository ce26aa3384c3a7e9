"""Evidence for the proposer: floor fractions, Nsight Compute output, compile stats (GPU)."""

import pytest

from tik_kernels.evaluator.evidence import compile_evidence, floors, ncu_profile, parse_ncu_csv


def test_floor_fraction_is_the_roofline_time_over_the_measured_time():
    work = {"copy": {"bytes": 4_200_000, "flops": 0}, "mm": {"bytes": 1000, "flops": 7_000_000_000},
            "nothing": {"bytes": None, "flops": None}}
    cells = [{"cell": "copy", "median_us": 4.0}, {"cell": "mm", "median_us": 20.0},
             {"cell": "nothing", "median_us": 1.0}]
    copy, mm, nothing = floors(cells, work, "NVIDIA H200")
    # 4.2 MB at 4.2 TB/s is 1 us: at 4 us a quarter of the floor, memory-bound
    assert copy["floor_us"] == 1.0 and copy["floor_fraction"] == 0.25 and copy["bound"] == "memory"
    assert copy["GB_s"] == 1050.0
    # 7 GFLOP at 700 TFLOP/s is 10 us: half the floor at 20 us, compute-bound
    assert mm["floor_fraction"] == 0.5 and mm["bound"] == "compute" and mm["TFLOP_s"] == 350.0
    assert "floor_fraction" not in nothing
    # unknown hardware: achieved rates, but no fraction of a floor nobody measured
    (row, *_) = floors(cells, work, "NVIDIA A10")
    assert row["GB_s"] == 1050.0 and "floor_fraction" not in row


def test_ncu_is_not_available_on_the_interpreter_and_its_csv_parses():
    assert "not available on the CPU interpreter" in ncu_profile("linear", "", "x", device="cpu")["error"]
    text = ('==PROF== Connected\n"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread"\n'
            '"","","usecond","register/thread"\n"0","_linear_kernel","12.5","128"\n')
    assert parse_ncu_csv(text) == [{"kernel": "_linear_kernel", "gpu__time_duration.sum": 12.5,
                                    "launch__registers_per_thread": 128.0}]
    assert parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM") == []


@pytest.mark.gpu
def test_compile_stats_of_the_linear_root_on_the_gpu():
    from tik_kernels.contracts import get_contract

    c = get_contract("linear")
    cells = [x.name for x in c.cells("gpu")][:3]
    ev = compile_evidence("linear", c.root_path.read_text(), device="cuda", cells=cells, timeout=600)
    assert ev["failure"] is None and ev["import_error"] is None and not ev["errors"], ev
    assert set(ev["work"]) == set(cells) and all(w["bytes"] and w["flops"] for w in ev["work"].values())
    assert ev["kernels"], "no compiled kernel seen"
    for k in ev["kernels"]:
        assert k["registers"] and k["registers"] > 0 and k["num_warps"] and k["shared_bytes"] is not None
        assert k["spills"] is not None and k["cells"] and set(k["cells"]) <= set(cells)
    # a broken implementation is an import error, not a failure of the child
    bad = compile_evidence("linear", "raise RuntimeError('nope')\n", device="cuda", cells=cells[:1])
    assert bad["failure"] is None and "nope" in bad["import_error"]
