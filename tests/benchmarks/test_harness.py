"""The CPU-testable parts of benchmarks/harness.py: statistics, bits, rotation bookkeeping, the summary file."""

import json
import math
import statistics

import pytest
import torch

from benchmarks import harness as H


def test_geomean():
    assert H.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert H.geomean([2.0, None, 8.0]) == pytest.approx(4.0)
    assert H.geomean([]) is None and H.geomean([None]) is None
    with pytest.raises(ValueError):
        H.geomean([1.0, 0.0])  # a zero ratio is a bug upstream, never averaged away
    # the arithmetic mean (a plausible slip) is not what a ratio average means
    assert H.geomean([0.5, 2.0]) == pytest.approx(1.0) != statistics.mean([0.5, 2.0])


def test_quantile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0]
    assert H.quantile(xs, 0.5) == statistics.median(xs)
    assert H.quantile(xs, 0.0) == 1.0 and H.quantile(xs, 1.0) == 10.0
    assert H.quantile(xs, 0.1) == pytest.approx(1.5)
    s = H.summarize(xs)
    assert s["median_us"] == 3.5 and s["rounds"] == 6 and s["min_us"] == 1.0


def test_rates():
    r = H.rates(10.0, nbytes=42e6, flops=7e9)
    assert r["tbps"] == pytest.approx(4.2) and r["copy_fraction"] == pytest.approx(1.0)
    assert r["tflops"] == pytest.approx(700.0) and r["bf16_fraction"] == pytest.approx(1.0)
    assert H.rates(10.0) == {}


def test_bits_equal_compares_raw_bits():
    a = torch.randn(4, 8).to(torch.bfloat16)
    assert H.bits_equal(a, a.clone())
    b = a.clone()
    b.view(torch.int16)[1, 2] ^= 1  # one mantissa bit
    assert not H.bits_equal(a, b)
    z, nz = torch.zeros(3, dtype=torch.bfloat16), -torch.zeros(3, dtype=torch.bfloat16)
    assert torch.equal(z, nz) and not H.bits_equal(z, nz)  # value equality would call -0.0 and 0.0 the same
    nan = torch.full((2,), float("nan"), dtype=torch.bfloat16)
    assert not torch.equal(nan, nan) and H.bits_equal(nan, nan.clone())  # same NaN bits are equal bits
    assert not H.bits_equal(a, a.float())  # dtype differs
    assert not H.bits_equal(a, a[:2])  # shape differs
    assert H.bits_equal(a.t(), a.t().contiguous())  # layout is not bits
    f = torch.randn(5, dtype=torch.float64)
    assert H.bits_equal(f, f.clone()) and not H.bits_equal(f, torch.nextafter(f, f + 1))
    assert H.tree_bits_equal((a, [f]), (a.clone(), [f.clone()])) and not H.tree_bits_equal((a, a), (a,))


def test_plan_copies_reaches_factor_times_l2():
    mb = 1024 * 1024
    n = H.plan_copies(3 * mb, l2_bytes=50 * mb, factor=4)
    assert n == math.ceil(200 / 3) and n * 3 * mb >= 4 * 50 * mb
    assert H.plan_copies(500 * mb) == 1  # one copy already far larger than L2
    assert H.plan_copies(1024) == H.MAX_COPIES  # capped
    assert H.plan_copies(3 * mb, max_total_bytes=30 * mb) == 10  # the memory there is
    assert H.plan_copies(0) == 1


@pytest.mark.parametrize("est,copies", [(1e-6, 7), (5e-3, 7), (1e-4, 1), (1e-5, 256)])
def test_plan_calls_whole_passes(est, copies):
    calls = H.plan_calls(est, copies, target_replay_s=2e-3)
    assert calls >= copies and calls % copies == 0
    order = H.rotation_order(calls, copies)
    assert sorted(set(order)) == list(range(copies))  # every copy read
    if copies > 1:
        assert all(a != b for a, b in zip(order, order[1:], strict=False))  # never the same copy twice in a row
    assert all(order.count(i) == calls // copies for i in range(copies))


def test_copies_are_new_storage_with_same_values():
    x = torch.randn(4, 4)
    w = torch.randn(4, 4, requires_grad=True)
    sets = H.make_copies((x, w, 3), 3)
    assert len(sets) == 3 and sets[0][0] is x
    ptrs = {s[0].data_ptr() for s in sets}
    assert len(ptrs) == 3 and all(torch.equal(s[0], x) and s[2] == 3 for s in sets)
    assert all(s[1].is_leaf and s[1].requires_grad for s in sets)  # a backward stops at its copy
    # a tensor passed twice counts once; a view counts what it covers (a clone copies only that)
    assert H.tensor_bytes((x, x, [w], {"k": x[1:]})) == (16 + 16 + 12) * 4


def test_compare_on_cpu_reports_fallback_and_errors():
    a = torch.randn(64, 64)

    def broken(a):
        raise RuntimeError("no kernel for this shape\nsecond line")

    fns = {"mm": lambda a: a @ a, "add": lambda a: a + a, "broken": broken}
    t = H.compare(fns, (a,), rounds=3, nbytes=3 * a.numel() * 4)
    c = t["contenders"]
    assert c["broken"] == {"error": "RuntimeError: no kernel for this shape"}
    for n in ("mm", "add"):
        assert c[n]["rounds"] == 3 and c[n]["median_us"] > 0 and c[n]["graph"] is False
        assert "eager" in c[n]["fallback"] and c[n]["tbps"] > 0
    assert t["timer"] == "cpu wall clock" and t["copies"] == 1
    assert H.best_of(t, ["mm", "add", "broken", "absent"])[0] in ("mm", "add")
    assert H.best_of(t, ["broken"]) == (None, None)


def test_update_summary_changes_only_owned_keys(tmp_path):
    path = tmp_path / "summary_h200.json"
    path.write_text(json.dumps({"linear_geomean": 1.34, "decode_geomean": 1.2, "other_team_key": "kept"}))
    doc = H.update_summary(path, {"decode_geomean": 0.98, "decode_worst": 1.1}, source="results/x.json",
                           command="PYTHONPATH=. python benchmarks/bench_speed.py --only decode")
    on_disk = json.loads(path.read_text())
    assert on_disk == doc
    assert on_disk["linear_geomean"] == 1.34 and on_disk["other_team_key"] == "kept"
    assert on_disk["decode_geomean"] == 0.98 and on_disk["decode_worst"] == 1.1
    assert set(on_disk["_provenance"]) == {"decode_geomean", "decode_worst"}
    assert on_disk["_provenance"]["decode_worst"]["file"] == "results/x.json"
    assert "lower is better" in on_disk["_note"]
    H.update_summary(path, {"linear_geomean": 1.01}, source="results/y.json", command="c")
    again = json.loads(path.read_text())
    assert again["decode_geomean"] == 0.98 and again["_provenance"]["decode_geomean"]["file"] == "results/x.json"
    assert not list(tmp_path.glob("*.tmp*"))  # the atomic write leaves nothing behind
    with pytest.raises(ValueError):
        H.update_summary(path, {"_provenance": 1}, source="s")


def test_update_summary_creates_file(tmp_path):
    path = tmp_path / "sub" / "summary.json"
    H.update_summary(path, {"prefill_geomean": None}, source="s", command="c")
    assert json.loads(path.read_text())["prefill_geomean"] is None


def test_provenance():
    env = H.environment()
    for k in ("gpu", "driver", "torch", "triton", "git_commit", "date", "python"):
        assert env[k]
    cmd = H.command_line([str(H.REPO / "benchmarks" / "bench_speed.py"), "--only", "decode", "--out", "a b"])
    assert cmd == "PYTHONPATH=. python benchmarks/bench_speed.py --only decode --out 'a b'"


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_compare_on_gpu_graphs_rotation_and_fallback():
    """On a GPU: graph replay, copies past 4 x L2, and a contender that syncs the host falls back and says so."""
    x = torch.randn(1024, 1024, device="cuda")  # 4 MiB: 50 copies to pass 200 MiB

    def syncs(x):
        y = x * 2
        y.sum().item()  # a host sync: not capturable
        return y

    t = H.compare({"mul": lambda x: x * 2, "add": lambda x: x + 1, "syncs": syncs}, (x,), rounds=5,
                  nbytes=2 * x.numel() * 4)
    assert t["copies"] * x.numel() * 4 >= H.L2_FACTOR * H.L2_BYTES and not t["below_l2_factor"]
    assert t["calls"] % t["copies"] == 0
    c = t["contenders"]
    assert c["mul"]["graph"] and c["add"]["graph"] and c["mul"]["median_us"] > 0
    assert c["syncs"]["graph"] is False and "graph capture failed" in c["syncs"]["fallback"]
    assert 0 < c["mul"]["copy_fraction"] < 1.5


def test_in_processes_splits_distinct_items_over_spawned_workers():
    # sorted(chunk) in each process: the chunks are the interleaved shares of the distinct items
    assert H.in_processes(sorted, [3, 1, 2, 5, 4, 3], 2) == [2, 3, 4, 1, 5]
    assert H.in_processes(sorted, [], 3) == []


def test_busy_us_counts_overlapping_kernels_once():
    from types import SimpleNamespace as NS

    def k(s, e):
        return NS(time_range=NS(start=s, end=e))

    # [0, 10] and [5, 12] overlap (12 µs), [20, 25] stands apart (5), [21, 22] lies inside it
    assert H.busy_us([k(20, 25), k(0, 10), k(5, 12), k(21, 22)]) == 17
    assert H.busy_us([]) == 0
