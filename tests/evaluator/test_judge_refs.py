"""The judge's references (`measure.timed_outputs_ok`): kept across evaluations for small cells, compared on the GPU
for large ones, with the verdicts of the judge that built every reference afresh on the CPU.

`fresh_judge` is that judge as it was before references were kept (a copy, as the oracle): every scenario below
(a wrong timed call on any one variant, a root that disagrees with stock PyTorch, row samples, wrong dtypes, missing
variants) must get the same (verdict, reason) from it, from the judge without a fingerprint, and from the judge with
one on its first call (references computed and kept) and its second (references from the cache, no bench case)."""

from __future__ import annotations

import pytest
import torch
from evaluator_fixtures import tiny

from tik_kernels.contract import error_stats, flatten_outputs
from tik_kernels.evaluator import measure
from tik_kernels.evaluator.checks import spec
from tik_kernels.evaluator.measure import rel_rms, timed_outputs_ok
from tik_kernels.evaluator.timing import MAX_CALLS, variant_seeds

BOUND = 0.05


def close_to(outs: list, refs: list[torch.Tensor], bound: float) -> tuple[bool, str]:
    """`measure.close_to` before it compared on the GPU and before `rel_rms` (the oracle's own)."""
    if len(outs) != len(refs):
        return False, f"{len(outs)} outputs, reference has {len(refs)}"
    worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if isinstance(o, tuple):
            o, rows = o
            if rows is not None:
                if r.dim() == 0 or (rows.numel() and (int(rows.max()) >= r.shape[0] or int(rows.min()) < 0)):
                    return False, f"output {k}: row sample outside the output"
                r = r[rows]
        if o.shape != r.shape or o.dtype != r.dtype:
            return False, f"output {k} is {spec(o)}, reference {spec(r)}"
        if o.is_floating_point():
            _, rel = error_stats(o, r)
            if not rel <= bound:
                return False, f"output {k}: rel_rms {rel:.3g} from the reference (bound {bound:g})"
            worst = max(worst, rel)
        else:
            frac = float((o == r).double().mean()) if o.numel() else 1.0
            if frac < 0.99:
                return False, f"output {k}: only {frac:.1%} of elements equal to the reference"
    return True, f"rel_rms <= {worst:.3g}"


def fresh_judge(contract, cell, c: dict, device: str, bound: float) -> tuple[bool, str]:
    """The judge before references were kept: a bench case and a baseline call per variant, compared on the CPU."""
    cand = c["outputs"].get("candidate", [])
    root = c["outputs"].get("root", [])
    seeds = c["seeds"]
    if len(cand) != len(seeds):
        return False, f"{len(cand)} timed outputs for {len(seeds)} input variants"
    for v, s in enumerate(seeds):
        case = contract.bench_case(cell, s, device)
        refs, what = None, "root's timed output"
        if case.baseline is not None:
            base = [t.detach().to("cpu") for t in flatten_outputs(case.baseline())]
            if v < len(root) and close_to(root[v], base, bound)[0]:
                refs, what = base, "stock-PyTorch output"
        del case
        outs = cand[v]
        if refs is None:
            if v >= len(root) or len(root[v]) != len(outs):
                return False, "no reference for the timed outputs"
            if any((a[1] is None) != (b[1] is None) or (a[1] is not None and not torch.equal(a[1], b[1]))
                   for a, b in zip(outs, root[v], strict=True)):
                return False, "timed outputs sampled differently from the root's"
            refs, outs = [d for d, _ in root[v]], [d for d, _ in outs]
        ok, detail = close_to(outs, refs, bound)
        if not ok:
            return False, f"timed call on input variant {v} is wrong vs the {what}: {detail}"
    return True, f"timed outputs match the reference on {len(seeds)} input variants"


def baseline_outputs(contract, cell, seeds, device="cpu") -> list[list[torch.Tensor]]:
    return [[t.to("cpu") for t in flatten_outputs(contract.bench_case(cell, s, device).baseline())] for s in seeds]


def sent(outs: list[list[torch.Tensor]], rows: torch.Tensor | None = None) -> list[list[tuple]]:
    """Timed outputs as the child sends them: whole, or the rows `rows` of each (the same rows for every output)."""
    return [[(t.clone(), None) if rows is None else (t[rows].clone(), rows) for t in per_v] for per_v in outs]


def scenarios(contract, cell, n: int, seed: int = 0) -> dict[str, dict]:
    seeds = variant_seeds(seed, n)
    base = baseline_outputs(contract, cell, seeds)
    rows = torch.tensor([1, 4, 5, 7])

    def cell_of(cand, root, seeds=seeds):
        return {"outputs": {"candidate": cand, "root": root}, "seeds": seeds}

    def broken(v, how, rows=None):
        outs = [[t.clone() for t in per_v] for per_v in base]
        outs[v] = [how(t) for t in outs[v]]
        return sent(outs, rows)

    doubled = broken(n // 2, lambda t: t * 2)  # the root itself off stock PyTorch on one variant
    out = {"good": cell_of(sent(base), sent(base)),
           "root_off_cand_follows": cell_of(doubled, doubled),
           "root_off_cand_stock": cell_of(sent(base), doubled),
           "sampled_good": cell_of(sent(base, rows), sent(base, rows)),
           "sampled_bad_last": cell_of(broken(n - 1, lambda t: t.flip(0), rows), sent(base, rows)),
           "sampled_differently": cell_of(sent(base, rows[:2]), broken(n // 2, lambda t: t * 2, rows)),
           "wrong_dtype": cell_of(broken(n - 1, lambda t: t.float()), sent(base)),
           "too_few_variants": cell_of(sent(base)[:-1], sent(base)),
           "no_root_for_last": cell_of(sent(base), broken(n - 1, lambda t: t * 2)[:-1] + [[]]),
           "nan": cell_of(broken(n // 2, lambda t: torch.full_like(t, float("nan"))), sent(base))}
    for v in sorted({0, 1, n // 2, n - 1}):  # any one variant's timed call wrong
        out[f"zeros_at_{v}"] = cell_of(broken(v, torch.zeros_like), sent(base))
    return out


def test_rel_rms_is_error_stats_relative_rms():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(257, 33, generator=g).to(torch.bfloat16)
    o = (r.float() + 0.01 * torch.randn(257, 33, generator=g)).to(torch.bfloat16)
    nan, inf = o.clone(), o.clone()
    nan[5, 3], inf[0, 0] = float("nan"), float("-inf")
    cases = [(o, r), (r, r), (nan, r), (inf, r), (o, nan), (o, torch.zeros_like(r)), (o[:0], r[:0]),
             (o.float(), r.float()), (torch.zeros(()), torch.ones(()))]
    for out, ref in cases:
        want, got = error_stats(out, ref)[1], rel_rms(out, ref)
        assert got == want or (got != got and want != want), (got, want)
    assert rel_rms(o, r) > 0 and rel_rms(nan, r) == float("inf")


@pytest.fixture
def empty_cache(monkeypatch):
    monkeypatch.setattr(measure, "_REF_CACHE", type(measure._REF_CACHE)())
    return measure._REF_CACHE


@pytest.fixture
def counted(monkeypatch):
    """The tiny contract with its bench cases counted."""
    contract = tiny()
    calls = []
    real = contract.bench_case

    def bench_case(cell, seed, device):
        calls.append((cell.name, seed, device))
        return real(cell, seed, device)

    monkeypatch.setattr(contract, "bench_case", bench_case)
    return contract, calls


@pytest.mark.parametrize("n", [2, MAX_CALLS])
def test_kept_references_give_the_verdicts_of_fresh_ones(counted, empty_cache, n):
    contract, calls = counted
    cell = contract.cells("cpu")[0]
    expect = {"good": True, "root_off_cand_follows": True, "sampled_good": True}
    for name, c in scenarios(contract, cell, n).items():
        want = fresh_judge(contract, cell, c, "cpu", BOUND)
        assert want[0] == expect.get(name, False), (name, want)
        empty_cache.clear()
        assert timed_outputs_ok(contract, cell, c, "cpu", BOUND) == want, name
        assert not empty_cache  # no fingerprint: nothing kept
        assert timed_outputs_ok(contract, cell, c, "cpu", BOUND, "fp") == want, name  # computed, kept
        calls.clear()
        assert timed_outputs_ok(contract, cell, c, "cpu", BOUND, "fp") == want, name  # from the cache
        assert calls == [], name
    zeros = fresh_judge(contract, cell, scenarios(contract, cell, n)[f"zeros_at_{n - 1}"], "cpu", BOUND)
    assert zeros[1].startswith(f"timed call on input variant {n - 1} is wrong vs the stock-PyTorch output: output 0")


def test_a_changed_fingerprint_seed_or_cell_misses_the_cache(counted, empty_cache):
    contract, calls = counted
    small, other = contract.cells("cpu")
    c = scenarios(contract, small, 4)["good"]
    calls.clear()
    assert timed_outputs_ok(contract, small, c, "cpu", BOUND, "fp1")[0]
    assert len(calls) == 4 and len(empty_cache) == 4
    calls.clear()
    assert timed_outputs_ok(contract, small, c, "cpu", BOUND, "fp1")[0] and calls == []
    assert timed_outputs_ok(contract, small, c, "cpu", BOUND, "fp2")[0]  # the contract changed
    assert [s for _, s, _ in calls] == c["seeds"]
    calls.clear()
    c1 = scenarios(contract, small, 4, seed=1)["good"]  # another search seed
    calls.clear()
    assert timed_outputs_ok(contract, small, c1, "cpu", BOUND, "fp1")[0]
    assert [s for _, s, _ in calls] == variant_seeds(1, 4) and len(empty_cache) == 12
    calls.clear()
    c_other = scenarios(contract, other, 2)["good"]
    calls.clear()
    assert timed_outputs_ok(contract, other, c_other, "cpu", BOUND, "fp1")[0]
    assert {n for n, _, _ in calls} == {other.name}


def test_the_cache_keeps_only_small_cells_and_stays_bounded(counted, empty_cache, monkeypatch):
    contract, calls = counted
    cell = contract.cells("cpu")[1]  # T=32 x H: a few KB per variant
    c = scenarios(contract, cell, 8)["good"]
    calls.clear()
    per_variant = sum(t.numel() * t.element_size() for t in baseline_outputs(contract, cell, c["seeds"][:1])[0])
    monkeypatch.setattr(measure, "REF_CELL_BYTES", 8 * per_variant - 1)  # the cell's 8 variants do not fit
    assert timed_outputs_ok(contract, cell, c, "cpu", BOUND, "fp")[0]
    assert not empty_cache
    monkeypatch.setattr(measure, "REF_CELL_BYTES", 8 * per_variant)
    monkeypatch.setattr(measure, "REF_CACHE_BYTES", 3 * (per_variant + 1024))  # three entries at most
    calls.clear()
    assert timed_outputs_ok(contract, cell, c, "cpu", BOUND, "fp")[0]
    assert len(calls) == 8 and [k[2] for k in empty_cache] == c["seeds"][-3:]  # the least recently used went out
    assert sum(n for _, n in empty_cache.values()) <= measure.REF_CACHE_BYTES


@pytest.mark.gpu
def test_large_cells_are_compared_on_the_gpu_with_the_verdicts_of_the_cpu(empty_cache):
    """A cell of 16384 tokens (row-sampled outputs, compared on the GPU) and a decode cell (kept, compared on the
    CPU) of the real rmsnorm contract: the verdicts of the fresh judge that compared everything on the CPU."""
    from tik_kernels.contracts import get_contract

    contract = get_contract("rmsnorm")
    cells = {c.params["T"]: c for c in contract.cells("gpu") if c.params["row_shape"] == [1024]}
    for T, n in ((16384, 2), (8, MAX_CALLS)):
        cell, seeds = cells[T], variant_seeds(0, n)
        base = baseline_outputs(contract, cell, seeds, "cuda")
        rows = torch.randperm(T)[: min(T, 4096)].sort().values
        good = sent(base, rows if T > 4096 else None)
        bad = sent([per_v if v != n - 1 else [t.flip(0) for t in per_v] for v, per_v in enumerate(base)],
                   rows if T > 4096 else None)
        for cand in (good, bad):
            c = {"outputs": {"candidate": cand, "root": good}, "seeds": seeds}
            want = fresh_judge(contract, cell, c, "cuda", BOUND)
            assert want[0] == (cand is good), want
            assert timed_outputs_ok(contract, cell, c, "cuda", BOUND, "fp") == want
            assert timed_outputs_ok(contract, cell, c, "cuda", BOUND, "fp") == want
        assert bool(empty_cache) == (T == 8), T
