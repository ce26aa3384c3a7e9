"""The decision functions behind the GPU timing checks, on synthetic evidence (no GPU here): a profiled call's
kernels against the window its spin and marker bound (any stream, any size), eager calls against graph
replays, and the timed rows recomputed by the child against the timed call's rows."""

from __future__ import annotations

import torch

from tik_kernels.evaluator.measure import integrity_ok, timed_rows_ok
from tik_kernels.evaluator.timing import window_evidence

TIMED, SIDE = 7, 13  # stream ids as the profiler reports them


def _spin(t0: float, t1: float) -> tuple:
    return ("spin_kernel", TIMED, t0, t1)


def _call(kernels: list[tuple], marker_at: float, marker_us: float = 2.0) -> list[tuple]:
    events = [_spin(0.0, 1000.0), *kernels, ("spin_kernel", TIMED, marker_at, marker_at + marker_us)]
    return sorted(events, key=lambda e: e[2])


def test_kernels_on_the_timed_stream_are_inside_the_window():
    ev = window_evidence(_call([("k", TIMED, 1001, 1004), ("k", TIMED, 1004.2, 1008)], marker_at=1008.3), 7.5, True)
    assert ev["kernels"] == 2 and ev["escaped"] == 0 and ev["overlap_spin"] == 0 and ev["saw_marker"]
    assert abs(ev["kernel_us"] - 6.8) < 1e-9 and ev["streams"] == 1


def test_side_stream_work_escapes_whatever_its_size():
    # one tiny kernel: ready when the spin ends, like the marker, and still running when the marker starts
    small = window_evidence(_call([("mul", SIDE, 1001.0, 1002.6)], marker_at=1001.1), 1.0, True)
    assert small["escaped"] == 1 and small["streams"] == 1
    # fifty back to back, or one long matmul
    fifty = window_evidence(_call([("mul", SIDE, 1001.0 + 1.5 * i, 1002.4 + 1.5 * i) for i in range(50)],
                                  marker_at=1001.2), 1.1, True)
    assert fifty["escaped"] == 50
    big = window_evidence(_call([("gemm", SIDE, 1001.0, 1400.0)], marker_at=1001.2), 1.1, True)
    assert big["escaped"] == 1
    # started before the timed window: it overlaps the spin
    early = window_evidence(_call([("mul", SIDE, 10.0, 12.0)], marker_at=1001.2), 1.1, True)
    assert early["overlap_spin"] == 1


def test_a_side_stream_joined_back_before_the_end_event_is_inside():
    ev = window_evidence(_call([("a", SIDE, 1001, 1005), ("b", TIMED, 1001, 1003)], marker_at=1005.3), 4.4, True)
    assert ev["escaped"] == 0 and ev["overlap_spin"] == 0 and ev["streams"] == 2


def _cell(cand_us, root_us, profile, timing="graph", eager=None):
    s = {"candidate": {"event_us": list(cand_us), "wall_us": [u + 1000 for u in cand_us]},
         "root": {"event_us": list(root_us), "wall_us": [u + 1000 for u in root_us]}}
    return {"samples": s, "profile": profile, "timing": timing, "eager_us": {"candidate": eager} if eager else {}}


def _honest(kernel_us=4.0):
    return {"kernels": 3, "kernel_us": kernel_us, "window_us": kernel_us + 0.5, "overlap_spin": 0, "escaped": 0,
            "saw_spin": True, "saw_marker": True, "spin_covered": True, "streams": 1}


def test_integrity_rejects_escaped_kernels_with_the_reason():
    prof = {"candidate": {**_honest(3.0), "escaped": 1, "window_us": 1.0}, "root": _honest()}
    ok, why = integrity_ok(_cell([4.1] * 9, [4.0] * 9, prof), {})
    assert not ok and "ended after the timed stream had passed its end event" in why


def test_integrity_rejects_an_eager_call_far_faster_than_its_graph():
    prof = {"candidate": {"error": "profiler unavailable"}, "root": _honest()}
    ok, why = integrity_ok(_cell([80.0] * 9, [4.0] * 9, prof, eager=[1.1] * 5), {})
    assert not ok and "work escapes the timing events when not captured" in why


def test_integrity_passes_an_honest_candidate_timed_as_graph_replays():
    prof = {"candidate": _honest(3.8), "root": _honest()}
    ok, why = integrity_ok(_cell([4.1] * 9, [4.0] * 9, prof, eager=[4.3] * 5), {})
    assert ok and why.startswith("timed graph replays; kernels inside the timed window"), why


def _rows_cell(cand_again, timed, root_again=None, root_timed=None):
    rows = {"candidate": cand_again}
    if root_again is not None:
        rows["root"] = root_again
    return {"rows": rows, "outputs": {"candidate": timed, "root": root_timed or timed}}


def test_timed_rows_compare_bitwise_whole_and_sampled_outputs():
    out = torch.randn(32, 4).to(torch.bfloat16)
    idx = torch.tensor([5, 17, 3])
    whole = [[(out, None)]]
    assert timed_rows_ok(_rows_cell([{"v": 0, "rows": idx, "outputs": [out[idx].clone()]}], whole))[0]
    nudged = out[idx].clone()
    # one bit of one element flipped (a multiplicative nudge of a random bf16 value sometimes rounded back to it)
    nudged.view(torch.int16)[1, 2] ^= 1
    ok, why = timed_rows_ok(_rows_cell([{"v": 0, "rows": idx, "outputs": [nudged]}], whole))
    assert not ok and "differ from the same rows of the timed call" in why
    # a sampled output: the rows sent back are sorted indices; recomputed rows must be among them
    sent = torch.tensor([3, 5, 9, 17])
    sampled = [[(out[sent].clone(), sent)]]
    assert timed_rows_ok(_rows_cell([{"v": 0, "rows": idx, "outputs": [out[idx].clone()]}], sampled))[0]
    ok, why = timed_rows_ok(_rows_cell([{"v": 0, "rows": torch.tensor([4]), "outputs": [out[[4]]]}], sampled))
    assert not ok and "not among the rows sent back" in why


def test_timed_rows_skip_a_cell_where_the_root_itself_differs():
    out = torch.randn(8, 4)
    idx = torch.tensor([1, 2])
    bad = [{"v": 0, "rows": idx, "outputs": [out[idx] + 1]}]
    ok, why = timed_rows_ok(_rows_cell(bad, [[(out, None)]], root_again=bad))
    assert ok and why.startswith("skipped: the root's own rows differ")
    assert timed_rows_ok({"rows": {}, "outputs": {}}) == (True, "skipped: the cell declares no token rows")


def test_timed_rows_learn_from_the_root_timed_alone_whether_to_skip():
    """On the GPU the control run times the root alone, in a trusted child: its rows decide whether a cell is
    token-wise. A root whose rows differ only beside the candidate (which shares its process and can rewrite it) fails
    the candidate instead of skipping its check; a root whose rows differ alone too still skips the cell."""
    out = torch.randn(8, 4)
    idx = torch.tensor([1, 2])
    good = [{"v": 0, "rows": idx, "outputs": [out[idx].clone()]}]
    bad = [{"v": 0, "rows": idx, "outputs": [out[idx] + 1]}]
    timed = [[(out, None)]]
    alone_ok = {"rows": {"root": good}, "outputs": {"root": timed}}
    alone_bad = {"rows": {"root": bad}, "outputs": {"root": timed}}
    # the candidate's own rows are wrong (a large-T switch) and it made the root's rows beside it differ
    ok, why = timed_rows_ok(_rows_cell(bad, timed, root_again=bad), alone_ok)
    assert not ok and "the candidate changed the root" in why, why
    ok, why = timed_rows_ok(_rows_cell(bad, timed, root_again=bad), alone_bad)
    assert ok and why.startswith("skipped: the root's own rows differ, timed alone"), why
    assert timed_rows_ok(_rows_cell(good, timed, root_again=good), alone_ok)[0]
    ok, why = timed_rows_ok(_rows_cell(bad, timed, root_again=good), alone_ok)
    assert not ok and "differ from the same rows of the timed call" in why
    # a control run without rows (kept from before they were asked for): the root beside the candidate decides
    assert timed_rows_ok(_rows_cell(bad, timed, root_again=bad), {"rows": {}, "outputs": {}})[0]


def test_a_profiler_broken_only_beside_the_candidate_fails_it():
    """The control run profiles the root alone, in a trusted child: where that worked, a profiler error on the
    candidate's call, or a root profile broken beside it, no longer skips the profiler's checks."""
    escaped = {**_honest(3.0), "escaped": 1, "window_us": 1.0}
    # the candidate broke the profiler for its own call
    prof = {"candidate": {"error": "RuntimeError: profiler already enabled"}, "root": _honest()}
    ok, why = integrity_ok(_cell([4.1] * 9, [4.0] * 9, prof), {}, None, _honest())
    assert not ok and "works for the root timed alone" in why, why
    # ... or for the root's call beside it, hiding a side stream
    prof = {"candidate": escaped, "root": {"error": "RuntimeError: broken"}}
    assert integrity_ok(_cell([4.1] * 9, [4.0] * 9, prof), {})[1].startswith("skipped: profiler unusable")
    ok, why = integrity_ok(_cell([4.1] * 9, [4.0] * 9, prof), {}, None, _honest())
    assert not ok and "ended after the timed stream had passed its end event" in why, why
    # where the profiler fails alone too, it is this machine's: skipped, as before
    ok, why = integrity_ok(_cell([4.1] * 9, [4.0] * 9, prof), {}, None, {"error": "no CUPTI"})
    assert ok and why.startswith("skipped: profiler unusable"), why


def test_neighbours_slowed_is_the_geometric_mean_over_the_cells_of_root_and_incumbent():
    from tik_kernels.evaluator.measure import NEIGHBOUR_SLOWDOWN, NEIGHBOUR_SLOWDOWN_ALL, neighbours_slowed

    def run(root, inc=None):
        cells = {}
        for i, r in enumerate(root):
            s = {"root": {"event_us": [r] * 5}}
            if inc is not None:
                s["incumbent"] = {"event_us": [inc[i]] * 5}
            cells[f"c{i}"] = {"samples": s}
        return {"cells": cells}

    alone = run([10.0] * 4, [20.0] * 4)
    # 10% slower on every cell: within the per-cell limit everywhere, past the limit over all cells
    slowed = neighbours_slowed(run([11.0] * 4, [22.0] * 4), alone)
    assert abs(slowed - 1.1) < 1e-9 and 1.1 < NEIGHBOUR_SLOWDOWN and slowed > NEIGHBOUR_SLOWDOWN_ALL
    # cell-to-cell noise either way averages out
    assert abs(neighbours_slowed(run([10.4, 9.6, 10.2, 9.8], [20.0] * 4), alone) - 1.0) < 0.01
    # a cell that failed, or that the control run did not time, is left out; nothing to compare gives None
    partial = run([12.0] * 4)
    partial["cells"]["c0"] = {"error": "boom"}
    assert abs(neighbours_slowed(partial, alone) - 1.2) < 1e-9
    assert neighbours_slowed({"cells": {}}, alone) is None


def test_kernels_one_stream_runs_overlapped_count_once():
    """Programmatic dependent launch: a kernel's programs start (and wait) while the kernel before it on the same
    stream finishes, so their profiled intervals overlap. The call's busy time counts that overlap once; the same
    overlap between two streams is two streams' work and counts twice (the check it feeds catches side work)."""
    pdl = [("linear", TIMED, 1001.0, 1030.0), ("combine", TIMED, 1002.0, 1033.0)]
    ev = window_evidence(_call(pdl, marker_at=1033.5), 32.5, True)
    assert abs(ev["kernel_us"] - 32.0) < 1e-9 and abs(ev["kernel_sum_us"] - 60.0) < 1e-9
    cell = _cell([33.0] * 9, [33.0] * 9, {"candidate": ev, "root": _honest()})
    ok, why = integrity_ok(cell, {})
    assert ok, why
    # the same two kernels, one of them on a side stream joined back before the end event: 60 us in a 32.5 us window
    side = [("linear", TIMED, 1001.0, 1030.0), ("combine", SIDE, 1002.0, 1033.0)]
    ev = window_evidence(_call(side, marker_at=1033.5), 32.5, True)
    assert abs(ev["kernel_us"] - 60.0) < 1e-9 and ev["escaped"] == 0
    ok, why = integrity_ok(_cell([33.0] * 9, [33.0] * 9, {"candidate": ev, "root": _honest()}), {})
    assert not ok and "work on another stream escapes the timing events" in why
    # gaps and nested intervals on one stream
    from tik_kernels.evaluator.timing import busy_us
    assert busy_us([("a", 1, 0.0, 10.0), ("b", 1, 2.0, 5.0), ("c", 1, 12.0, 13.0), ("d", 2, 0.0, 1.0)]) == 12.0
